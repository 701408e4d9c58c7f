"""The memory plan: composing measured bytes per placement, judging flavors, recommending; the plan command's
one-line errors; the Space's hardware flavor; the UI's hardware line."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from cli_runner import run_cli

from h3app.hardware.fake_cuda import PhaseBytes
from h3app.hardware.flavors import BY_NAME, BY_PRICE, FLAVORS, GB
from h3app.hardware.planner import (
    HOST_RESERVE,
    PREFERENCE,
    RESERVE,
    Measured,
    Placement,
    compose,
    fits,
    host_bytes,
    judge,
    recommend,
)
from h3app.hardware.rehearsal import Rehearsal, RehearsalOptions
from h3app.hardware.summary import hardware_line, remember

GIB = 2**30
ROOT = Path(__file__).resolve().parents[1]


def _measured(lora: bool = False) -> Measured:
    """The bytes the full-size t2va 544p rehearsal counts (bf16, the conditioner cut to 51 layers), as a fixture
    that needs no rehearsal."""
    weights = {"transformer": int(66.3 * GB), "text_encoder": int(52.5 * GB), "vae": int(10.4 * GB),
               "audio_vae": int(0.6 * GB)}
    resident = sum(weights.values())
    phases = {"text_encoder": PhaseBytes(resident, resident + GB // 10),
              "denoise": PhaseBytes(resident, resident + int(3.6 * GB)),
              "vae_decode": PhaseBytes(resident, resident + int(1.8 * GB)),
              "audio_vae_decode": PhaseBytes(resident, resident + int(0.4 * GB))}
    rehearsal = Rehearsal(options=RehearsalOptions(), components=weights, host_components={}, lora_bytes=0,
                          pristine_host_bytes=0, phases=phases, device_peak=resident + int(3.6 * GB),
                          host_peak=GB, tokens={"video": 18870, "audio": 414, "text": 80, "total": 19364},
                          targets_bound=312 if lora else 0, evaluations=1, video_shape=(124, 544, 960, 3),
                          audio_shape=(2, 165600))
    return Measured(rehearsal=rehearsal, weights=weights, fp8_transformer_bytes=int(33.2 * GB),
                    largest_linear_bytes=96768 * 2688 * 2, block_bytes=int(1.3 * GB),
                    lora_bytes=int(2.8 * GB) if lora else 0, fp8_text_encoder_bytes=int(27.6 * GB),
                    largest_text_encoder_linear_bytes=25600 * 5120 * 2, text_encoder_load_bytes=int(66.7 * GB))


def test_whole_bf16_without_offload_does_not_fit_an_80_gb_card():
    peak, _ = compose(_measured(), Placement("none"), None)
    assert peak > 80 * GB
    assert not fits(peak, BY_NAME["a100-large"], Placement("none"))
    assert not fits(peak, BY_NAME["rtx-pro-6000"], Placement("none"))


def test_the_none_placement_matches_what_the_rehearsal_measured():
    measured = _measured()
    peak, _ = compose(measured, Placement("none"), None)
    assert peak == measured.rehearsal.device_peak


def test_offload_lowers_the_peak_and_group_lowers_it_further():
    measured = _measured()
    none, _ = compose(measured, Placement("none"), None)
    auto, phases = compose(measured, Placement("auto"), None)
    group, _ = compose(measured, Placement("group"), None)
    assert auto < none and group <= auto
    assert phases["denoise"]["resident"] == measured.weights["transformer"]
    assert phases["text_encoder"]["resident"] == measured.weights["text_encoder"]


def test_fp8_stores_the_transformer_in_half_the_bytes():
    measured = _measured()
    plain, _ = compose(measured, Placement("auto"), None)
    fp8, phases = compose(measured, Placement("auto", fp8=True), None)
    assert phases["denoise"]["resident"] == measured.fp8_transformer_bytes
    assert phases["denoise"]["transient"] == int(3.6 * GB) + measured.largest_linear_bytes  # one upcast layer
    assert fp8 <= plain


def test_context_parallel_splits_activations_not_weights():
    measured = _measured()
    _, one = compose(measured, Placement("none"), None)
    _, four = compose(measured, Placement("none", ranks=4), None)
    assert four["denoise"]["resident"] == one["denoise"]["resident"]
    assert four["denoise"]["transient"] == one["denoise"]["transient"] // 4
    assert not fits(1, BY_NAME["a100-large"], Placement("none", ranks=4))  # four ranks need four GPUs


def test_lora_factors_and_merged_pristine_copies_are_counted():
    measured = _measured(lora=True)
    without, _ = compose(measured, Placement("auto"), None)
    unmerged, _ = compose(measured, Placement("auto"), "unmerged")
    assert unmerged - without == measured.lora_bytes
    measured.rehearsal.pristine_host_bytes = 60 * GIB
    assert host_bytes(measured, Placement("auto"), "merged") - host_bytes(measured, Placement("auto"), "unmerged") \
        == 60 * GIB


def test_recommended_is_the_cheapest_box_that_fits_gpu_and_host_then_the_fastest_placement():
    measured = _measured(lora=True)
    choice = recommend(measured, "unmerged")
    assert choice is not None
    chosen = BY_NAME[choice["hardware"]]
    placement = Placement(choice["offload"], fp8=choice["fp8"], fp8_text_encoder=choice["fp8_text_encoder"])
    assert choice["options"] == f"--device cuda --dtype bfloat16 {placement.label}"
    assert choice["host_bytes"] == host_bytes(measured, placement, "unmerged")
    assert choice["usd_per_hour"] == chosen.usd_per_hour and choice["host_ram_bytes"] == chosen.host_bytes
    assert judge(choice["peak_gpu_bytes"], choice["host_bytes"], chosen, placement)["fits"]

    def fits_both(box, p):
        return judge(compose(measured, p, "unmerged")[0], host_bytes(measured, p, "unmerged"), box, p)["fits"]

    for box in FLAVORS:  # nothing cheaper fits with any placement the runtime offers
        if box.usd_per_hour is not None and box.usd_per_hour < chosen.usd_per_hour:
            assert not any(fits_both(box, p) for p in PREFERENCE), box.name
    faster = PREFERENCE[:PREFERENCE.index(placement)]
    assert not any(fits_both(chosen, p) for p in faster)
    assert recommend(measured, "merged")["fp8"] is False  # merged LoRA never rounds into fp8


def test_recommended_options_carry_the_context_parallel_ranks_the_plan_assumed():
    """A plan for 4 ranks splits the denoising activations 4 ways: its options must start 4 ranks, as asked."""
    import app
    from h3app.cli import build_parser

    measured = _measured(lora=True)
    for ulysses, ring, flags in ((4, 1, "--ulysses 4"), (2, 2, "--ulysses 2 --ring 2"), (1, 4, "--ring 4")):
        choice = recommend(measured, "unmerged", ranks=ulysses * ring, ring=ring)
        assert choice["options"].endswith(flags) and BY_NAME[choice["hardware"]].gpus >= 4
        for args in (app.build_parser().parse_args(shlex.split(choice["options"])),
                     build_parser().parse_args(["generate", *shlex.split(choice["options"]), "--prompt", "x",
                                                "--out", "x.mp4"])):
            assert (args.ulysses, args.ring) == (ulysses, ring)
    assert "--ulysses" not in recommend(measured, "unmerged")["options"]


def test_fits_is_true_only_when_gpu_and_host_both_fit():
    box = BY_NAME["a100-large"]  # 80 GB GPU, 142 GB host
    placement = Placement("auto")
    room = box.gpu_bytes - RESERVE
    assert judge(room, box.host_bytes - HOST_RESERVE, box, placement)["fits"] is True
    host_short = judge(room, box.host_bytes - HOST_RESERVE + 1, box, placement)
    assert host_short["fits_gpu"] is True and host_short["fits_host"] is False and host_short["fits"] is False
    gpu_short = judge(room + 1, GB, box, placement)
    assert gpu_short["fits_gpu"] is False and gpu_short["fits_host"] is True and gpu_short["fits"] is False


def test_offloading_everything_onto_a100_large_is_judged_by_its_142_gb_of_host_ram():
    """The issue's finding: auto offload needed more host RAM than a100-large has, and the plan said it fit."""
    measured = _measured(lora=True)
    measured.weights["text_encoder"] = measured.text_encoder_load_bytes  # the whole, uncut conditioner
    peak, _ = compose(measured, Placement("auto"), "unmerged")
    host = host_bytes(measured, Placement("auto"), "unmerged")
    row = judge(peak, host, BY_NAME["a100-large"], Placement("auto"))
    assert row["fits_gpu"] and host > 142 * GB and row["fits"] is False


def test_host_ram_counts_the_load_dtype_and_the_uncut_conditioner():
    measured = _measured()
    resident = host_bytes(measured, Placement("none"), None)
    assert resident == measured.text_encoder_load_bytes + measured.rehearsal.host_peak  # the largest as loaded
    offloaded = host_bytes(measured, Placement("auto", fp8=True, fp8_text_encoder=True), None)
    stored = measured.fp8_text_encoder_bytes + measured.weights["vae"] + measured.weights["audio_vae"]
    assert offloaded == stored + measured.weights["transformer"] + measured.rehearsal.host_peak  # loaded in bf16


def test_the_fp8_text_encoder_stores_the_conditioner_in_fp8_and_upcasts_one_linear():
    measured = _measured()
    _, plain = compose(measured, Placement("auto"), None)
    _, both = compose(measured, Placement("auto", fp8=True, fp8_text_encoder=True), None)
    assert both["text_encoder"]["resident"] == measured.fp8_text_encoder_bytes
    assert both["text_encoder"]["transient"] == plain["text_encoder"]["transient"] \
        + measured.largest_text_encoder_linear_bytes


def test_the_right_sizing_goals_hold_on_the_measured_sizes():
    measured = _measured(lora=True)
    h200, rtx, a100 = BY_NAME["h200"], BY_NAME["rtx-pro-6000"], BY_NAME["a100-large"]
    bf16, _ = compose(measured, Placement("none"), "unmerged")
    assert bf16 <= 138 * GB and fits(bf16, h200, Placement("none"))
    both = Placement("none", fp8=True, fp8_text_encoder=True)
    assert judge(compose(measured, both, "unmerged")[0], host_bytes(measured, both, "unmerged"), rtx, both)["fits"]
    assert any(judge(compose(measured, p, "unmerged")[0], host_bytes(measured, p, "unmerged"), a100, p)["fits"]
               for p in PREFERENCE)


# The published table as Hugging Face prints it (hub-docs docs/hub/jobs-configuration.md, `hf jobs hardware`):
# name, vCPU, RAM, accelerator, $/h. The flavors module is checked against this text, row by row.
PUBLISHED = """
t4-small 4 15 1x T4 (16 GB) 0.40
t4-medium 8 30 1x T4 (16 GB) 0.60
a10g-small 4 15 1x A10G (24 GB) 1.00
a10g-large 12 46 1x A10G (24 GB) 1.50
a10g-largex2 24 92 2x A10G (48 GB) 3.00
a10g-largex4 48 184 4x A10G (96 GB) 5.00
a100-large 12 142 1x A100 (80 GB) 2.50
a100x4 48 568 4x A100 (320 GB) 10.00
a100x8 96 1136 8x A100 (640 GB) 20.00
h200 23 256 1x H200 (141 GB) 5.00
h200x2 46 512 2x H200 (282 GB) 10.00
h200x4 92 1024 4x H200 (564 GB) 20.00
h200x8 184 2048 8x H200 (1128 GB) 40.00
rtx-pro-6000 23 256 1x RTX PRO 6000 (96 GB) 2.75
rtx-pro-6000x2 46 512 2x RTX PRO 6000 (192 GB) 5.50
rtx-pro-6000x4 92 1024 4x RTX PRO 6000 (384 GB) 11.00
rtx-pro-6000x8 184 2048 8x RTX PRO 6000 (768 GB) 22.00
l4x1 8 30 1x L4 (24 GB) 0.80
l4x4 48 186 4x L4 (96 GB) 3.80
l40sx1 8 62 1x L40S (48 GB) 1.80
l40sx4 48 382 4x L40S (192 GB) 8.30
l40sx8 192 1534 8x L40S (384 GB) 23.50
"""


@pytest.mark.parametrize("line", PUBLISHED.strip().splitlines(), ids=lambda line: line.split()[0])
def test_every_flavor_holds_its_published_numbers(line):
    match = re.fullmatch(r"(\S+) (\d+) (\d+) (\d+)x (.+) \((\d+) GB\) ([\d.]+)", line)
    name, vcpus, ram, gpus, gpu, total, price = match.groups()
    box = BY_NAME[name]
    assert (box.vcpus, box.host_bytes, box.gpus, box.gpu) == (int(vcpus), int(ram) * GB, int(gpus), gpu)
    assert box.gpu_bytes * box.gpus == int(total) * GB and box.usd_per_hour == float(price)


def test_the_flavor_table_is_the_published_one_and_no_h100_is_left():
    published = {line.split()[0] for line in PUBLISHED.strip().splitlines()}
    assert {f.name for f in FLAVORS if not f.zero_gpu} == published
    assert not any("H100" in f.gpu or "h100" in f.name for f in FLAVORS)


def test_zero_gpu_is_judged_as_half_and_whole_rtx_pro_6000_and_never_recommended():
    zero = {f.name: f for f in FLAVORS if f.zero_gpu}
    assert {name: f.gpu_bytes for name, f in zero.items()} == {"zero-gpu-large": 48 * GB, "zero-gpu-xlarge": 96 * GB}
    assert all(f.space_hardware == "zero-a10g" and f.host_bytes is None for f in zero.values())
    row = judge(GB, GB, zero["zero-gpu-xlarge"], Placement("none"))
    assert row["fits_host"] is None and row["fits"] is True  # no published host RAM: the GPU decides
    assert not any(f.zero_gpu for f in BY_PRICE)


def test_every_space_flavor_is_a_valid_space_hardware_value():
    from huggingface_hub import SpaceHardware

    values = {h.value for h in SpaceHardware}
    assert {f.space_hardware for f in FLAVORS if f.space_hardware} <= values
    gpu_values = {v for v in values if not v.startswith("cpu")}
    assert gpu_values <= {f.space_hardware for f in FLAVORS}


def test_hardware_line_for_cpu_and_gpu():
    from test_hardware_preflight import _gpu_options

    from h3app.model.loader import LoadOptions

    cpu = hardware_line("tiny", LoadOptions(), device=None)
    assert cpu.startswith("CPU") and "tiny" in cpu
    options = _gpu_options()
    assert "no memory plan" in hardware_line("big", options, device=("H100", 80 * GB))

    class FakePlan:
        peak_gpu_bytes = 70 * GB

    remember("big", options, FakePlan())
    line = hardware_line("big", options, device=("H100", 80 * GB))
    assert "planned peak 70.0 GB" in line and "headroom 10.0 GB" in line


@pytest.mark.parametrize("argv, fragment", [
    (["--resolution", "1080p"], "resolution"),
    (["--offload", "disk"], "offload"),
    (["--duration", "40"], "duration"),
    (["--hardware", "h300"], "unknown hardware"),
    (["--ulysses", "0"], "ulysses"),
    (["--model", "MiniMaxAI/MiniMax-H3"], "plan --model"),
    (["--fp8", "--adapter", "x.safetensors", "--lora-mode", "merged"], "fp8"),
])
def test_bad_plan_options_get_one_line_and_exit_2(argv, fragment, capsys):
    """In-process: the same ``main`` a process runs (the exit status and the one stderr line)."""
    result = run_cli(capsys, "plan", *argv)
    assert result.code == 2, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0]


@pytest.mark.slow
def test_plan_on_the_tiny_checkpoint_answers_json_from_its_own_rehearsal(capsys):
    """The whole command on the tiny checkpoint: its rehearsal (identical layers replayed) gives every field."""
    import json

    result = run_cli(capsys, "plan", "--model", "tiny", "--json")
    assert result.code == 0, result.err[-2000:]
    plan = json.loads(result.out)
    assert {"peak_gpu_bytes", "host_bytes", "components", "phases", "fits", "recommended", "warnings"} <= set(plan)
    assert set(plan["components"]) >= {"transformer", "text_encoder", "vae", "audio_vae"}
    assert plan["tokens"]["video"] > 0 and plan["tokens"]["text"] > 0
    for name in ("text_encoder", "denoise", "vae_decode", "audio_vae_decode"):
        assert plan["phases"][name]["transient"] > 0, name
    assert plan["peak_gpu_bytes"] >= sum(plan["components"].values())
