"""The memory plan: composing measured bytes per placement, the judge's verdicts per flavor, each flavor's best
placement and the recommendation by $ per video; the plan command's cheap one-line errors; the Space's hardware
flavor; the UI's hardware line. Measurements here are fixtures (no rehearsal): fast."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from h3app.hardware.fake_cuda import PhaseBytes
from h3app.hardware.flavors import BY_NAME, BY_PRICE, FLAVORS, GB
from h3app.hardware.header_adapter import lightx2v_header
from h3app.hardware.judge import PlannedRequest, Setup, default_request, judge
from h3app.hardware.planner import HOST_RESERVE, PREFERENCE, RESERVE, Measured, Placement, compose, fits, host_bytes
from h3app.hardware.recommend import make_plan
from h3app.hardware.rehearsal import Rehearsal, RehearsalOptions
from h3app.hardware.summary import hardware_line, remember
from h3app.rules.h3_modules import FULL_SIZE_CONFIG, transformer_shapes

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
                          audio_shape=(2, 165600),  # FLOPs of one evaluation and the decode, as counted at 544p
                          flops={"denoise": {"base": {"bfloat16": 1282 * 10**12}},
                                 "vae_decode": {"base": {"float32": 1014 * 10**12}}})
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


LORA = Setup(adapter=lightx2v_header(transformer_shapes(FULL_SIZE_CONFIG), rank=128, alpha=8.0))
REQUEST = default_request()


def _plan(measured: Measured, setup: Setup = LORA, placement: Placement | None = None, **kwargs):
    return make_plan(REQUEST, placement or Placement(), setup, measured=measured, with_limits=False, **kwargs)


def test_each_flavor_best_is_its_fastest_fitting_placement_and_none_has_no_price():
    measured = _measured(lora=True)
    plan = _plan(measured)
    for row in plan.flavors:
        box = BY_NAME[row["name"]]
        verdicts = [judge(REQUEST, replace(p, ranks=r), box, LORA, measured) for p in PREFERENCE
                    for r in {1, box.gpus if 56 % box.gpus == 0 else 1}]
        fitting = [v for v in verdicts if v.fits]
        if not fitting:
            assert row["best"] is None, row["name"]  # nothing fits: no placement and no price
            continue
        best = row["best"]
        assert best is not None and judge(REQUEST, Placement(**{k: best[k] for k in (
            "offload", "fp8", "fp8_text_encoder", "ranks", "ring")}), box, LORA, measured).fits
        if best["video_s"] is not None:
            assert best["video_s"] <= min(v.prediction["video_s"] for v in fitting) + 1e-6, row["name"]
            assert best["usd_per_video"] == pytest.approx(best["video_s"] / 3600 * box.usd_per_hour, abs=1e-4) \
                if box.usd_per_hour is not None else best["usd_per_video"] is None
        assert best["options"] == f"--device cuda --dtype bfloat16 {best['placement']}"


def test_recommended_is_the_space_flavor_with_the_fewest_dollars_per_video():
    measured = _measured(lora=True)
    plan = _plan(measured)
    r = plan.recommended
    assert r is not None and BY_NAME[r["hardware"]].space_hardware == r["space_hardware"]
    priced = {row["name"]: row["best"]["usd_per_video"] for row in plan.flavors
              if row["best"] and row["space_hardware"] and row["best"]["usd_per_video"] is not None}
    assert r["usd_per_video"] == min(priced.values()) and r["hardware"] in priced
    placement = Placement(r["offload"], fp8=r["fp8"], fp8_text_encoder=r["fp8_text_encoder"], ranks=r["ranks"])
    verdict = judge(REQUEST, placement, BY_NAME[r["hardware"]], LORA, measured)
    assert verdict.fits and r["peak_gpu_bytes"] == verdict.peak_gpu_bytes and r["host_bytes"] == verdict.host_bytes
    assert r["options"] == f"--device cuda --dtype bfloat16 {placement.label}"
    assert r["usd_per_hour"] == BY_NAME[r["hardware"]].usd_per_hour and r["limits"] is None  # with_limits=False
    # every flavor that is not recommended says why, and Jobs-only and ZeroGPU boxes never are
    assert set(plan.left_out) | set(priced) == {row["name"] for row in plan.flavors}
    assert plan.left_out["h200"].startswith("Jobs only") and plan.left_out["zero-gpu-xlarge"].startswith("ZeroGPU")
    merged = _plan(measured, replace(LORA, lora_mode="merged"))
    assert merged.recommended["fp8"] is False  # merged LoRA never rounds into fp8
    assert all(row["best"] is None or row["best"]["fp8"] is False for row in merged.flavors)


def test_multi_gpu_flavors_are_priced_with_the_context_parallel_split_and_its_exchange():
    measured = _measured(lora=True)
    row = next(r for r in _plan(measured).flavors if r["name"] == "a100x4")
    assert row["best"]["ranks"] == 4 and row["best"]["options"].endswith("--ulysses 4")
    one = judge(REQUEST, replace(Placement(**{k: row["best"][k] for k in ("offload", "fp8", "fp8_text_encoder")}),
                                 ranks=1), BY_NAME["a100x4"], LORA, measured)
    four = judge(REQUEST, replace(one.placement, ranks=4), BY_NAME["a100x4"], LORA, measured)
    assert four.prediction["exchange_s"] > 0 == one.prediction["exchange_s"]
    assert four.prediction["step_s"] < one.prediction["step_s"]  # a quarter of the FLOPs, plus the exchange
    assert four.host_bytes == 4 * one.host_bytes  # one process per rank, each with its own host copy


def test_recommended_options_carry_the_context_parallel_ranks_the_plan_assumed():
    """A recommendation on a multi-GPU box splits the denoising activations N ways: its options start N ranks."""
    import app
    from h3app.cli import build_parser

    plan = _plan(_measured(lora=True), hardware="a100x4")
    choice = plan.recommended
    assert choice["options"].endswith("--ulysses 4") and choice["ranks"] == 4
    for args in (app.build_parser().parse_args(shlex.split(choice["options"])),
                 build_parser().parse_args(["generate", *shlex.split(choice["options"]), "--prompt", "x",
                                            "--out", "x.mp4"])):
        assert (args.ulysses, args.ring or 1) == (4, 1)
    assert "--ulysses" not in _plan(_measured(lora=True), hardware="rtx-pro-6000").recommended["options"]


def test_fits_is_true_only_when_gpu_and_host_both_fit():
    box = BY_NAME["a100-large"]  # 80 GB GPU, 142 GB host
    measured = _measured()
    verdict = judge(REQUEST, Placement("auto"), box, Setup(), measured)
    room = box.gpu_bytes - RESERVE - verdict.peak_gpu_bytes
    host_room = box.host_bytes - HOST_RESERVE - verdict.host_bytes
    assert verdict.gpu_margin == room and verdict.host_margin == host_room
    assert verdict.fits == (room >= 0 and host_room >= 0)
    short_host = replace(box, host_bytes=box.host_bytes - host_room - 1)
    row = judge(REQUEST, Placement("auto"), short_host, Setup(), measured)
    assert row.fits_gpu == (room >= 0) and row.fits_host is False and row.fits is False
    short_gpu = replace(box, gpu_bytes=box.gpu_bytes - room - 1, host_bytes=10**15)
    row = judge(REQUEST, Placement("auto"), short_gpu, Setup(), measured)
    assert row.fits_gpu is False and row.fits_host is True and row.fits is False


def test_offloading_everything_onto_a100_large_is_judged_by_its_142_gb_of_host_ram():
    """The issue's finding: auto offload needed more host RAM than a100-large has, and the plan said it fit."""
    measured = _measured(lora=True)
    measured.weights["text_encoder"] = measured.text_encoder_load_bytes  # the whole, uncut conditioner
    row = judge(REQUEST, Placement("auto"), BY_NAME["a100-large"], LORA, measured)
    assert row.fits_gpu and row.host_bytes > 142 * GB and row.fits is False


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
    assert judge(REQUEST, both, rtx, LORA, measured).fits
    assert any(judge(REQUEST, p, a100, LORA, measured).fits for p in PREFERENCE)


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
    row = judge(REQUEST, Placement("none", fp8=True, fp8_text_encoder=True), zero["zero-gpu-xlarge"], Setup(),
                _measured())
    assert row.fits_host is None and row.fits is True  # no published host RAM: the GPU decides
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


BAD_PLANS = [
    (["--height", "100", "--width", "1344"], "--height must be a positive multiple of 32"),
    (["--height", "768"], "give both --height and --width"),
    (["--height", "1024", "--width", "1344"], "more than this model generates"),
    (["--offload", "disk"], "offload"),
    (["--duration", "40"], "duration"),
    (["--frames", "1000"], "--frames"),
    (["--steps", "1"], "--steps must be between"),
    (["--dtype", "float99"], "unknown dtype"),
    (["--device", "cpu"], "plan judges GPU boxes"),
    (["--hardware", "h300"], "unknown hardware"),
    (["--ulysses", "0"], "ulysses"),
    (["--model", "MiniMaxAI/MiniMax-H3"], "plan --model"),
    (["--fp8", "--adapter", "x.safetensors", "--lora-mode", "merged"], "fp8"),
]


def test_bad_plan_options_get_one_line_exit_2_and_load_no_torch():
    """Every refusal in one interpreter: one line on stderr, exit 2, torch never imported (what makes a refusal fast;
    its seconds are printed, not asserted: a wall clock judges the machine, bench/ holds speed as ratios)."""
    import json
    import os

    code = ("import io, json, sys, time, contextlib\nfrom h3app.cli import main\nout = []\n"
            f"for argv in {[argv for argv, _ in BAD_PLANS]!r}:\n"
            "    err = io.StringIO(); started = time.perf_counter()\n"
            "    with contextlib.redirect_stderr(err):\n"
            "        try:\n            code = main(['plan', *argv])\n"
            "        except SystemExit as done:\n            code = done.code\n"
            "    out.append([code, err.getvalue(), time.perf_counter() - started])\n"
            "print(json.dumps({'runs': out, 'torch': 'torch' in sys.modules}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["torch"] is False
    for (argv, fragment), (code, err, seconds) in zip(BAD_PLANS, result["runs"]):
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], (argv, err)
        print(f"plan {' '.join(argv)}: refused in {seconds:.3f} s")


def test_plan_takes_generates_request_flags_and_reports_the_request_it_judged():
    from h3app.cli import build_parser
    from h3app.commands.plan import plan_options

    argv = ["--workflow", "fl2va", "--height", "544", "--width", "960", "--frames", "226", "--steps", "30"]
    request, placement, setup = plan_options(build_parser().parse_args(["plan", *argv]))
    assert request == PlannedRequest("fl2va", 544, 960, 226, 30)
    generate = build_parser().parse_args(["generate", *argv, "--prompt", "x", "--out", "x.mp4"])
    assert (generate.workflow, generate.height, generate.width, generate.frames, generate.steps) == \
        ("fl2va", 544, 960, 226, 30)  # the same flags, parsed by the same add_request_flags
    assert plan_options(build_parser().parse_args(["plan", "--duration", "9"]))[0].frames == 226
    default, _, _ = plan_options(build_parser().parse_args(["plan"]))
    assert default == REQUEST and (default.width, default.height, default.frames) == (1344, 768, 124)
    assert default.steps >= 20  # the undistilled base's count, not a Turbo adapter's
    tiny, _, _ = plan_options(build_parser().parse_args(["plan", "--model", "tiny"]))
    assert tiny == default_request("tiny") and tiny.steps < default.steps
    plan = _plan(_measured(), Setup(), placement)
    assert plan.to_json()["request"] == {"workflow": "t2va", "height": 768, "width": 1344, "frames": 124,
                                         "steps": default.steps, "cache": "none"}


@pytest.mark.slow
def test_plan_on_the_tiny_checkpoint_answers_json_from_its_own_rehearsal(capsys):
    """The whole command on the tiny checkpoint, in process: its rehearsal (identical layers replayed) gives every
    field, each flavor's best and the recommendation's limits (the tiny model holds the longest clip)."""
    import json

    from h3app.cli import main

    assert main(["plan", "--model", "tiny", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {"request", "peak_gpu_bytes", "host_bytes", "components", "phases", "fits", "flavors", "recommended",
            "left_out", "warnings"} <= set(plan)
    assert plan["request"]["steps"] == default_request("tiny").steps
    assert set(plan["components"]) >= {"transformer", "text_encoder", "vae", "audio_vae"}
    assert plan["tokens"]["video"] > 0 and plan["tokens"]["text"] > 0
    for name in ("text_encoder", "denoise", "vae_decode", "audio_vae_decode"):
        assert plan["phases"][name]["transient"] > 0, name
    assert plan["peak_gpu_bytes"] >= sum(plan["components"].values())
    assert all(row["best"] is not None for row in plan["flavors"])  # a few MB fit every box
    assert plan["recommended"]["limits"]["max_frames"] == 345 and plan["recommended"]["limits"]["max_pixels"] == 6144


@pytest.mark.parametrize("flags, asked", [([], "auto"), (["--attention", "sdpa"], "sdpa"),
                                          (["--attention", "fa3"], "fa3")])
def test_plan_attention_is_the_backend_the_setup_prices(flags, asked):
    from h3app.cli import build_parser
    from h3app.commands.plan import plan_options

    _, _, setup = plan_options(build_parser().parse_args(["plan", *flags]))
    assert setup.attention == asked


def test_plan_refuses_an_unknown_attention_backend_in_one_line():
    result = subprocess.run([sys.executable, "-m", "h3app", "plan", "--attention", "xformers"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "--attention" in result.stderr and len(result.stderr.strip().splitlines()) == 1
