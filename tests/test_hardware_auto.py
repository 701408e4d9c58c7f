"""``python app.py`` with no flags on the box it gets: the real model, placed as fast as the box allows, accepted by
its own start-up check — on fake CUDA at full size for the boxes people rent; tiny on the CPU without a GPU; every
flag and variable still wins.

The five boxes share one full-size rehearsal of the default request (``planner.measure`` keeps it for the process):
each test composes from it, so the module costs one rehearsal (about a minute on two cores), not five.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import app
from h3app.errors import H3AppError
from h3app.hardware import preflight
from h3app.hardware.flavors import BY_NAME, GB, Flavor
from h3app.hardware.judge import default_request, judge
from h3app.hardware.recommend import make_plan
from h3app.model.loader import LoadOptions
from h3app.rules.choices import REAL_REPO_ID

APP_VARIABLES = ("H3APP_MODEL", "H3APP_DEVICE", "H3APP_DTYPE", "H3APP_OFFLOAD", "H3APP_FP8", "H3APP_FP8_TEXT_ENCODER",
                 "H3APP_ULYSSES", "H3APP_RING", "H3APP_SKIP_PLAN", "H3APP_VAE_DTYPE")

# The five boxes (GPU GB, host GB; GB = 10⁹ as Hugging Face lists them), the GPU name a driver reports, the
# flavor whose row they are, and the placement expected: the fastest that fits both GPU and host RAM. The A100's is
# resident with both fp8 flags because the video decoder is bf16 on a GPU (--vae-dtype auto); with an fp32 decoder
# that placement is over its 80 GB and group offload is the fastest (docs/hardware.md, "Where to run").
BOXES = {
    "a100-80gb-142gb": ("NVIDIA A100-SXM4-80GB", 80, 142, "a100-large", "--offload none --fp8 --fp8-text-encoder"),
    "rtx-pro-6000-96gb-256gb": ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 96, 256, "rtx-pro-6000",
                                "--offload none --fp8 --fp8-text-encoder"),
    "h200-141gb-256gb": ("NVIDIA H200", 141, 256, "h200", "--offload none"),
    "l40s-48gb-62gb": ("NVIDIA L40S", 48, 62, "l40sx1", None),
    "l4-24gb-30gb": ("NVIDIA L4", 24, 30, "l4x1", None),
}


def _fresh(monkeypatch, **variables: str) -> None:
    """Only ``variables`` set, as on a fresh Space (app.choose writes its choice into the environment; setting each
    name first makes monkeypatch remove it again after the test)."""
    for name in APP_VARIABLES:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(autouse=True)
def _no_app_variables(monkeypatch):
    _fresh(monkeypatch)


def _box(name: str, gpu_gb: int, host_gb: int, gpus: int = 1) -> Flavor:
    return Flavor("detected", name, gpus, gpu_gb * GB, host_gb * GB, None, None, None)


def _gpu_options(serving) -> LoadOptions:
    """LoadOptions of the choice, for a CUDA device this CPU machine does not have (LoadOptions would refuse it)."""
    options = LoadOptions(dtype=getattr(torch, serving.dtype))
    for name, value in (("device", serving.device), ("offload", serving.offload), ("fp8", serving.fp8),
                        ("fp8_text_encoder", serving.fp8_text_encoder)):
        object.__setattr__(options, name, value)
    return options


def _start_up_check(choice, box: Flavor, request=None):
    """The app's own start-up check on ``box`` for what it chose."""
    serving = choice.serving
    return preflight.check_before_download(serving.model, _gpu_options(serving), device=(box.gpu, box.gpu_bytes),
                                           host=box.host_bytes, ranks=serving.ulysses * serving.ring,
                                           ring=serving.ring, request=request)


def test_without_a_gpu_the_app_serves_tiny_on_the_cpu():
    args = app.build_parser().parse_args([])
    choice = app.choose(args, box=None)
    assert (args.model, args.device, args.dtype, args.offload, args.fp8, args.ulysses) == \
        ("tiny", "cpu", "float32", "none", False, 1)
    assert choice.verdict is None and choice.line.startswith("no CUDA GPU")


def test_tiny_on_a_gpu_box_runs_tiny_on_cuda_without_a_plan():
    args = app.build_parser().parse_args(["--model", "tiny"])
    choice = app.choose(args, box=_box("NVIDIA H200", 141, 256))
    assert (args.model, args.device, args.dtype, args.offload) == ("tiny", "cuda", "bfloat16", "none")
    assert choice.verdict is None and "\n" not in choice.line


def test_the_choice_reaches_ranks_through_the_variables_a_person_would_set(monkeypatch):
    """Ranks re-run the same command line: the choice goes to the environment, and a parser reading it there
    chooses nothing more."""
    args = app.build_parser().parse_args(["--model", "tiny"])
    app.choose(args, box=_box("NVIDIA H200", 141, 256))
    again = app.build_parser().parse_args([])
    assert (again.model, again.device, again.dtype, again.offload, again.fp8, again.ulysses, again.ring) == \
        ("tiny", "cuda", "bfloat16", "none", False, 1, 1)


def test_a_bad_rank_variable_is_one_line(monkeypatch):
    monkeypatch.setenv("H3APP_ULYSSES", "two")
    with pytest.raises(H3AppError, match="H3APP_ULYSSES must be a whole number"):
        app.build_parser()


@pytest.mark.slow
@pytest.mark.timeout(600)  # full-size rehearsals (the first one builds the default request's)
@pytest.mark.parametrize("box_id", BOXES)
def test_a_space_with_no_flags_serves_the_real_model_placed_for_its_box(box_id, capsys):
    gpu, gpu_gb, host_gb, flavor_name, expected = BOXES[box_id]
    box = _box(gpu, gpu_gb, host_gb)
    args = app.build_parser().parse_args([])
    if expected is None:
        with pytest.raises(H3AppError) as caught:
            app.choose(args, box=box)
        message = str(caught.value)
        assert "\n" not in message and message.startswith(REAL_REPO_ID) and "nothing was downloaded" in message
        assert "no placement fits" in message and "python -m h3app plan" in message  # where to look instead
        return
    choice = app.choose(args, box=box)
    serving = choice.serving
    assert (serving.model, serving.device, serving.dtype) == (REAL_REPO_ID, "cuda", "bfloat16")
    assert choice.verdict.placement.label == expected
    assert (args.offload, args.fp8, args.fp8_text_encoder, args.ulysses) == (
        serving.offload, serving.fp8, serving.fp8_text_encoder, 1)
    line = choice.line
    assert "\n" not in line and expected in line and gpu in line and "margin" in line
    request = default_request()
    assert f"{request.width}×{request.height}, {request.frames} frames, {request.steps} steps" in line
    accepted = _start_up_check(choice, box)  # the app's own start-up check accepts what it chose
    assert accepted is not None and accepted.fits and accepted.placement == choice.verdict.placement
    # the same judge: the plan's fastest placement for the flavor of this box is the app's choice
    row = next(r for r in make_plan(request, accepted.placement, hardware=flavor_name, with_limits=False).flavors)
    assert row["best"]["placement"] == expected and row["fits"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_flags_and_variables_still_win_and_fill_only_what_is_left(monkeypatch):
    box = _box("NVIDIA RTX PRO 6000 Blackwell Server Edition", 96, 256)
    args = app.build_parser().parse_args(["--offload", "auto"])
    choice = app.choose(args, box=box)
    assert args.offload == "auto" and choice.verdict.placement.offload == "auto"  # fp8 chosen around the flag
    assert _start_up_check(choice, box).fits
    off = {"H3APP_FP8": "0", "H3APP_FP8_TEXT_ENCODER": "0"}
    _fresh(monkeypatch, **off)
    args = app.build_parser().parse_args([])
    assert app.choose(args, box=box).verdict.placement.fp8 is False  # fp8 kept off; offload chosen around it
    _fresh(monkeypatch, **off, H3APP_OFFLOAD="none")
    with pytest.raises(H3AppError) as caught:  # resident bf16 on 96 GB: too big; what would fit is named
        app.choose(app.build_parser().parse_args([]), box=box)
    message = str(caught.value)
    assert "\n" not in message and "does not fit" in message and "nothing was downloaded" in message
    assert "use --offload none --fp8 --fp8-text-encoder" in message
    _fresh(monkeypatch, **off, H3APP_OFFLOAD="auto")
    args = app.build_parser().parse_args([])
    assert app.choose(args, box=box).verdict.placement.label == "--offload auto"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_several_gpus_are_used_by_context_parallel_when_it_is_faster():
    box = _box("NVIDIA H200", 141, 512, gpus=2)
    args = app.build_parser().parse_args([])
    choice = app.choose(args, box=box)
    assert (args.ulysses, args.ring) == (2, 1) and choice.verdict.placement.ranks == 2
    single = judge(default_request(), replace(choice.verdict.placement, ranks=1), box)
    assert single.fits and choice.verdict.prediction["video_s"] < single.prediction["video_s"]
    assert _start_up_check(choice, box).fits


def test_the_five_boxes_are_the_flavors_the_plan_judges():
    """The boxes above are rows of the flavor table: same GPU memory and host RAM."""
    for _, gpu_gb, host_gb, flavor_name, _ in BOXES.values():
        row = BY_NAME[flavor_name]
        assert (row.gpu_bytes, row.host_bytes) == (gpu_gb * GB, host_gb * GB), flavor_name
