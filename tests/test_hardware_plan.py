"""The memory plan: composing measured bytes per placement, judging flavors, recommending; the plan command's
one-line errors; the Space's hardware flavor; the UI's hardware line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from h3app.hardware.fake_cuda import PhaseBytes
from h3app.hardware.flavors import BY_NAME, FLAVORS, GB
from h3app.hardware.planner import Measured, Placement, compose, fits, host_bytes, recommend
from h3app.hardware.rehearsal import Rehearsal, RehearsalOptions
from h3app.hardware.summary import hardware_line, remember

GIB = 2**30
ROOT = Path(__file__).resolve().parents[1]


def _measured(lora: bool = False) -> Measured:
    """The bytes the full-size t2va 544p rehearsal counts (bf16), as a fixture that needs no rehearsal."""
    weights = {"transformer": int(61.7 * GIB), "text_encoder": int(62.1 * GIB), "vae": int(9.7 * GIB),
               "audio_vae": int(0.6 * GIB)}
    resident = sum(weights.values())
    phases = {"text_encoder": PhaseBytes(resident, resident + GIB // 10),
              "denoise": PhaseBytes(resident, resident + int(3.3 * GIB)),
              "vae_decode": PhaseBytes(resident, resident + int(3.0 * GIB)),
              "audio_vae_decode": PhaseBytes(resident, resident + GIB // 4)}
    rehearsal = Rehearsal(options=RehearsalOptions(), components=weights, host_components={}, lora_bytes=0,
                          pristine_host_bytes=0, phases=phases, device_peak=resident + int(3.3 * GIB),
                          host_peak=GIB, tokens={"video": 18870, "audio": 414, "text": 80, "total": 19364},
                          targets_bound=312 if lora else 0, evaluations=1, video_shape=(124, 544, 960, 3),
                          audio_shape=(2, 165600))
    return Measured(rehearsal=rehearsal, weights=weights, fp8_transformer_bytes=int(31.5 * GIB),
                    largest_linear_bytes=96768 * 2688 * 2, block_bytes=int(1.2 * GIB),
                    lora_bytes=int(2.6 * GIB) if lora else 0)


def test_whole_bf16_without_offload_does_not_fit_an_80_gb_card():
    peak, _ = compose(_measured(), Placement("none"), None)
    assert peak > 80 * GB
    assert not fits(peak, BY_NAME["a100-large"], Placement("none"))
    assert not fits(peak, BY_NAME["h100"], Placement("none"))


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
    assert phases["denoise"]["transient"] == int(3.3 * GIB) + measured.largest_linear_bytes  # one upcast layer
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


def test_recommended_is_the_smallest_flavor_that_fits():
    measured = _measured()
    choice = recommend(measured, None)
    assert choice is not None
    names = [f.name for f in FLAVORS]
    chosen = names.index(choice["hardware"])
    assert choice["peak_gpu_bytes"] <= BY_NAME[choice["hardware"]].gpu_bytes
    for smaller in FLAVORS[:chosen]:
        if smaller.zero_gpu:  # judged, never recommended (one worker holds the GPU for its lifetime)
            continue
        for placement in (Placement("none"), Placement("auto"), Placement("group"), Placement("group", fp8=True)):
            assert not fits(compose(measured, placement, None)[0], smaller, placement)
    assert recommend(measured, "merged")["fp8"] is False  # merged LoRA never rounds into fp8


def test_every_space_flavor_is_a_valid_space_hardware_value():
    from huggingface_hub import SpaceHardware

    values = {h.value for h in SpaceHardware}
    assert {f.space for f in FLAVORS if f.space} <= values
    gpu_values = {v for v in values if not v.startswith("cpu")}
    assert gpu_values <= {f.space for f in FLAVORS}


def test_readme_suggested_hardware_is_a_space_flavor_the_plan_recommends():
    from huggingface_hub import SpaceHardware

    front = (ROOT / "README.md").read_text().split("---")[1]
    value = re.search(r"^suggested_hardware:\s*(\S+)", front, re.M).group(1)
    assert value in {h.value for h in SpaceHardware}
    choice = recommend(_measured(lora=True), "unmerged")
    assert value == choice["space_hardware"]


def test_hardware_line_for_cpu_and_gpu():
    from h3app.model.loader import LoadOptions
    from tests.test_hardware_preflight import _gpu_options

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
def test_bad_plan_options_get_one_line_and_exit_2(argv, fragment, tmp_path):
    result = subprocess.run([sys.executable, "-m", "h3app", "plan", *argv], capture_output=True, text=True,
                            cwd=ROOT, timeout=300, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0]


def test_plan_on_the_tiny_checkpoint_answers_json_from_its_own_rehearsal():
    """The whole command on the tiny checkpoint: its rehearsal (identical layers replayed) gives every field."""
    import json

    result = subprocess.run([sys.executable, "-m", "h3app", "plan", "--model", "tiny", "--json"], capture_output=True,
                            text=True, cwd=ROOT, timeout=600, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    plan = json.loads(result.stdout)
    assert {"peak_gpu_bytes", "host_bytes", "components", "phases", "fits", "recommended", "warnings"} <= set(plan)
    assert set(plan["components"]) >= {"transformer", "text_encoder", "vae", "audio_vae"}
    assert plan["tokens"]["video"] > 0 and plan["tokens"]["text"] > 0
    for name in ("text_encoder", "denoise", "vae_decode", "audio_vae_decode"):
        assert plan["phases"][name]["transient"] > 0, name
    assert plan["peak_gpu_bytes"] >= sum(plan["components"].values())
