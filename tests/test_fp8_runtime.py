"""fp8 at run time and the placements the plan recommends: every placement's flags load the same way in app.py,
generate, check and grid; the recommended options run generate on the tiny model (offload on a fake GPU box, fp8
for real on the CPU); merged LoRA is refused with --fp8 in one line and leaves the weights as they were; offload
needs CUDA."""

from __future__ import annotations

import json
import shlex

import pytest
import torch
from cli_runner import assert_one_line, run_cli
from test_hardware_plan import _measured

from h3app.errors import H3AppError
from h3app.hardware.judge import Setup, default_request
from h3app.hardware.planner import PREFERENCE, Placement
from h3app.hardware.recommend import make_plan
from h3app.model import conditioner, fp8
from h3app.model.loader import LoadOptions, load_model

PROMPT = "a red ball moving right over a grey floor, low loud hum"


def _app_args(argv: list[str]):
    import app

    return app.build_parser().parse_args(argv)


def _command_args(command: str, argv: list[str]):
    from h3app.cli import build_parser

    return build_parser().parse_args([command, *argv])


def _placement(args) -> Placement:
    """The placement the flags set (app.py leaves unset ones to its choice for the box: off here)."""
    return Placement(args.offload or "none", fp8=bool(args.fp8), fp8_text_encoder=bool(args.fp8_text_encoder))


@pytest.mark.parametrize("placement", PREFERENCE, ids=lambda p: p.label)
def test_every_planned_placement_parses_to_itself_in_app_generate_check_and_grid(placement):
    argv = shlex.split(placement.label)
    assert _placement(_app_args(argv)) == placement
    for command, extra in (("generate", ["--prompt", "x", "--out", "x.mp4"]), ("check", ["--adapter", "a"]),
                           ("grid", ["--adapter", "a", "--prompt", "x", "--alphas", "1", "--out-dir", "d"])):
        assert _placement(_command_args(command, [*argv, *extra])) == placement, command


def test_the_fp8_variables_turn_the_flags_on(monkeypatch):
    monkeypatch.setenv("H3APP_FP8", "1")
    monkeypatch.setenv("H3APP_FP8_TEXT_ENCODER", "true")
    assert _placement(_app_args([])) == Placement("none", fp8=True, fp8_text_encoder=True)
    monkeypatch.setenv("H3APP_FP8", "0")
    monkeypatch.delenv("H3APP_FP8_TEXT_ENCODER")
    assert _placement(_command_args("generate", ["--prompt", "x", "--out", "x.mp4"])) == Placement("none")
    app_args = _app_args([])
    assert app_args.fp8 is False and app_args.fp8_text_encoder is None  # set off, and left to the app's choice


@pytest.mark.slow
def test_fp8_stores_transformer_and_conditioner_layers_in_float8_and_computes_in_the_load_dtype():
    model = load_model("tiny", options=LoadOptions(fp8=True, fp8_text_encoder=True))
    transformer, text_encoder = model.components["transformer"], model.components["text_encoder"]
    linears = [m for m in transformer.transformer_blocks.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.dtype == fp8.STORAGE for m in linears)
    layers = [m for m in conditioner.decoder(text_encoder).layers.modules() if isinstance(m, torch.nn.Linear)]
    assert layers and all(m.weight.dtype == fp8.STORAGE for m in layers)
    assert all(p.dtype == torch.float32 for p in text_encoder.model.visual.parameters())  # vision tower untouched
    assert text_encoder.dtype == torch.float32 and transformer.dtype == torch.float32


@pytest.mark.slow
def test_fp8_output_is_close_to_full_precision_but_not_identical():
    from h3app.backend.generation import run_generation
    from h3app.backend.metrics import psnr
    from h3app.request import GenerationRequest

    request = GenerationRequest(prompt=PROMPT, seed=0, steps=3)
    full = run_generation(load_model("tiny").pipeline("t2va"), request)
    low = run_generation(load_model("tiny", options=LoadOptions(fp8=True)).pipeline("t2va"), request)
    assert full.video.shape == low.video.shape and full.audio.shape == low.audio.shape
    quality = psnr(full.video, low.video)
    assert 15.0 < quality < float("inf")  # fp8 changes the output (it ran) and keeps the picture (docs/hardware.md)


@pytest.mark.slow
def test_merged_lora_with_fp8_is_refused_in_one_line_and_the_weights_are_untouched():
    from lora_fixtures import state_hash

    from h3app.backend.adapter_binding import AdapterBinder
    from h3app.model.repo import TINY_DIR
    from h3app.settings import LoRASettings

    model = load_model("tiny", options=LoadOptions(fp8=True))
    before = state_hash(model.transformer("t2va"))
    adapter = str(TINY_DIR.parent / "adapters" / "tiny_turbo_4step.safetensors")
    with pytest.raises(H3AppError) as caught:
        AdapterBinder(model).apply([LoRASettings(source=adapter, alpha=1.0, mode="merged")])
    assert str(caught.value) == fp8.MERGED_REFUSAL and "\n" not in str(caught.value)
    assert state_hash(model.transformer("t2va")) == before


def test_offload_without_cuda_is_one_line_not_a_traceback():
    with pytest.raises(H3AppError, match="needs --device cuda"):
        LoadOptions(offload="auto")


@pytest.mark.slow
@pytest.mark.parametrize("lora", [True, False], ids=["lora-unmerged", "no-lora"])
def test_the_recommended_options_run_generate_on_the_tiny_model(tmp_path, capsys, monkeypatch, lora):
    """The plan's recommendation for the issue's request (a 312-target rank-128 adapter, unmerged; and without an
    adapter), fed unchanged to app.py's and generate's parsers; then generate runs with exactly those options on the
    tiny model on a fake GPU box of the recommended flavor's memory (tests/test_offload_fake_cuda.py watches the
    hooks). Options that store weights in fp8 run for real on the CPU too."""
    from test_offload_fake_cuda import STEPS, assert_ran_every_evaluation_on_the_device, run_generate_on_box

    from h3app.hardware.flavors import BY_NAME
    from h3app.hardware.header_adapter import lightx2v_header
    from h3app.rules.h3_modules import FULL_SIZE_CONFIG, transformer_shapes
    from h3app.rules.steps import evaluations

    header = lightx2v_header(transformer_shapes(FULL_SIZE_CONFIG), rank=128, alpha=8.0) if lora else None
    choice = make_plan(default_request(), Placement(), Setup(adapter=header), measured=_measured(lora=lora),
                       with_limits=False).recommended
    argv = shlex.split(choice["options"])
    expected = ("cuda", "bfloat16", choice["offload"], choice["fp8"], choice["fp8_text_encoder"])
    app_args = _app_args(argv)
    assert (app_args.device, app_args.dtype, app_args.offload, app_args.fp8, app_args.fp8_text_encoder) == expected
    generate_args = _command_args("generate", [*argv, "--prompt", "x", "--out", "x.mp4"])
    assert (generate_args.device, generate_args.dtype, generate_args.offload, generate_args.fp8,
            generate_args.fp8_text_encoder) == expected
    assert choice["gpu_bytes"] == BY_NAME[choice["hardware"]].gpu_bytes
    result, trace, _ = run_generate_on_box(capsys, monkeypatch, tmp_path, argv, choice["gpu_bytes"])
    placed = "cpu" if choice["offload"] != "none" else "cuda"  # offloaded at load, or resident
    assert set(trace.after_load.values()) == {placed}
    assert_ran_every_evaluation_on_the_device(result, trace)
    if choice["fp8"]:
        out = tmp_path / "recommended-cpu.mp4"
        run = run_cli(capsys, "generate", "--model", "tiny", "--prompt", PROMPT, "--steps", str(STEPS),
                      "--out", str(out), "--json", *argv, "--device", "cpu", "--dtype", "float32", "--offload", "none")
        assert run.code == 0, run.err
        assert out.stat().st_size > 0 and json.loads(run.out)["evaluations"] == evaluations(STEPS)


@pytest.mark.slow
def test_generate_with_both_fp8_flags_runs_and_merged_is_refused_at_the_command_line(tmp_path, capsys):
    from h3app.model.repo import TINY_DIR

    out = tmp_path / "fp8.mp4"
    result = run_cli(capsys, "generate", "--model", "tiny", "--prompt", PROMPT, "--steps", "3", "--out", str(out),
                     "--fp8", "--fp8-text-encoder", "--json")
    assert result.code == 0, result.err
    assert out.stat().st_size > 0
    refused = run_cli(capsys, "generate", "--model", "tiny", "--prompt", PROMPT, "--steps", "3",
                      "--out", str(tmp_path / "m.mp4"), "--fp8", "--lora-mode", "merged",
                      "--adapter", str(TINY_DIR.parent / "adapters" / "tiny_turbo_4step.safetensors"))
    assert refused.code == 2 and not (tmp_path / "m.mp4").exists()
    assert_one_line(refused.err, "merged LoRA would round")


@pytest.mark.slow
def test_check_with_fp8_loads_the_fp8_transformer_and_the_pair_stays_identical(capsys, monkeypatch):
    from h3app.model import loader

    loaded = []
    original = loader.load_transformer

    def spy(*args, **kwargs):
        loaded.append(original(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(loader, "load_transformer", spy)
    result = run_cli(capsys, "check", "--model", "tiny", "--adapter", "assets/adapters/tiny_turbo_4step.safetensors",
                     "--a", "1:1.0", "--b", "16:0.0625", "--fp8", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["identical"] is True  # the delta is exact beside an fp8 base
    linear = next(m for m in loaded[0].transformer_blocks.modules() if isinstance(m, torch.nn.Linear))
    assert linear.weight.dtype == fp8.STORAGE


@pytest.mark.slow
def test_the_docs_quote_what_fp8_costs_on_the_trained_tiny_model():
    from pathlib import Path

    from bench.fp8_quality import markdown, measure

    docs = (Path(__file__).resolve().parents[1] / "docs" / "hardware.md").read_text()
    rows = measure()
    assert all(20.0 < r["frames_psnr_db"] < float("inf") for r in rows)
    assert markdown(rows) in docs
