"""``--vae-dtype``: the video decoder's layers in bf16, everything diffusers pins kept fp32 (its norms and layer
scales, the encoder, the whole audio VAE) — as loaded and as the full-size rehearsal builds it — and what it costs
on the tiny model (bench/vae_dtype_quality.py, the numbers docs/performance.md quotes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from h3app.hardware import full_size
from h3app.model import repo
from h3app.model.loader import LoadOptions, load_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bf16_model():
    return load_model("tiny", options=LoadOptions(vae_dtype=torch.bfloat16))


def _dtypes(module: torch.nn.Module) -> dict[str, torch.dtype]:
    return {name: tensor.dtype for name, tensor in [*module.named_parameters(), *module.named_buffers()]}


def test_the_decoder_computes_in_bf16_and_every_pinned_part_stays_fp32(bf16_model):
    vae, audio = bf16_model.components["vae"], bf16_model.components["audio_vae"]
    dtypes = _dtypes(vae)
    block = "decoder.transformer_blocks.0."
    assert dtypes[block + "attn.to_q.weight"] == dtypes[block + "ff.net.2.weight"] == torch.bfloat16
    assert dtypes[block + "norm1.weight"] == dtypes[block + "scale1"] == torch.float32
    assert {d for n, d in dtypes.items() if n.startswith(("encoder.", "quant_conv."))} == {torch.float32}
    assert set(_dtypes(audio).values()) == {torch.float32}


def test_the_rehearsal_builds_the_same_dtypes_the_loader_loads(bf16_model):
    config = json.loads((repo.TINY_DIR / "vae" / "config.json").read_text())
    built = full_size.build_meta("vae", LoadOptions(vae_dtype=torch.bfloat16),
                                 {k: v for k, v in config.items() if not k.startswith("_")})
    assert _dtypes(built) == _dtypes(bf16_model.components["vae"])


@pytest.mark.slow  # two generations on the tiny model
def test_bf16_frames_stay_close_to_fp32_and_the_audio_is_untouched():
    from bench.vae_dtype_quality import markdown, measure

    rows = measure()
    assert all(row["audio_identical"] for row in rows)  # the audio VAE is fp32 either way
    assert all(0 < row["max_abs_diff"] < 0.05 and row["frames_psnr_db"] > 40 for row in rows)
    assert "| seed |" in markdown(rows)


def test_the_flag_is_offered_and_a_bad_value_is_one_line():
    result = subprocess.run([sys.executable, "-m", "h3app", "generate", "--prompt", "x", "--out", "/tmp/x.mp4",
                             "--vae-dtype", "float16"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2 and "--vae-dtype" in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.strip()]) <= 3  # argparse's usage + one line


# --- --vae-dtype auto (the default): one resolution, rules.choices.vae_dtype_for, for every reader ---------------

@pytest.mark.parametrize(("asked", "device", "expected"), [
    ("auto", "cuda", "bfloat16"), ("auto", "cuda:1", "bfloat16"), ("auto", "cpu", "float32"),
    ("auto", "mps", "float32"), ("float32", "cuda", "float32"), ("bfloat16", "cpu", "bfloat16"),
    ("bf16", "cpu", "bfloat16")])
def test_auto_is_bf16_on_a_cuda_device_and_fp32_elsewhere(asked, device, expected):
    from h3app.rules.choices import vae_dtype_for

    assert vae_dtype_for(asked, device) == expected


def test_an_unknown_vae_dtype_is_one_line():
    from h3app.errors import H3AppError
    from h3app.rules.choices import vae_dtype_for

    with pytest.raises(H3AppError, match=r"--vae-dtype must be one of auto, float32, bfloat16"):
        vae_dtype_for("float16", "cuda")


def _args(command: str, *flags: str):
    from h3app.cli import build_parser

    return build_parser().parse_args([command, *flags])


def test_the_loader_resolves_auto_for_its_device(monkeypatch):
    """The CPU keeps fp32 (every CPU hash unchanged); a CUDA device gets bf16; a named dtype stays as named."""
    from h3app.commands.model_options import load_options
    from h3app.errors import H3AppError
    from h3app.model import loader
    from h3app.model.loader import decoder_dtype

    assert decoder_dtype(LoadOptions()) == torch.float32
    assert decoder_dtype(load_options(_args("generate", "--prompt", "x", "--out", "/tmp/x.mp4"))) == torch.float32
    monkeypatch.setattr(loader, "check_device", lambda name: name)  # no GPU here: the device is only a name
    assert decoder_dtype(LoadOptions(device="cuda")) == torch.bfloat16
    assert decoder_dtype(LoadOptions(device="cuda", vae_dtype="float32")) == torch.float32
    assert decoder_dtype(LoadOptions(device="cuda", vae_dtype=torch.float32)) == torch.float32
    with pytest.raises(H3AppError, match="--vae-dtype must be one of"):
        LoadOptions(vae_dtype="float16")  # refused when the options are made, before anything loads


@pytest.mark.parametrize("flags", [(), ("--vae-dtype", "float32"), ("--vae-dtype", "bfloat16")])
def test_the_plan_the_start_up_check_and_the_printed_flags_run_the_same_decoder(monkeypatch, flags):
    """``plan``'s setup, the start-up check's setup of the options the same flags load, and the flags a plan prints
    (``run_options``) parsed again: one decoder dtype. The default on a GPU box is bf16 and prints no flag."""
    from h3app.commands.model_options import load_options
    from h3app.commands.plan import plan_options
    from h3app.hardware.planner import Placement, dtype_name, run_options
    from h3app.hardware.preflight import setup_of
    from h3app.model import loader
    from h3app.model.loader import decoder_dtype

    monkeypatch.setattr(loader, "check_device", lambda name: name)
    _, _, setup = plan_options(_args("plan", *flags))
    assert setup.vae_dtype == (torch.float32 if "float32" in flags else torch.bfloat16)
    options = load_options(_args("generate", "--prompt", "x", "--out", "/tmp/x.mp4", "--device", "cuda", *flags))
    assert setup_of(options).vae_dtype == decoder_dtype(options) == setup.vae_dtype
    printed = run_options(Placement(), "bfloat16", dtype_name(setup.vae_dtype)).split()
    assert ("--vae-dtype" in printed) == ("float32" in flags)
    again = load_options(_args("generate", "--prompt", "x", "--out", "/tmp/x.mp4", *printed))
    assert decoder_dtype(again) == setup.vae_dtype


@pytest.mark.slow  # a full-size rehearsal per decoder dtype
def test_the_apps_choice_of_placement_judges_the_decoder_it_will_load():
    """app.py's Serving carries --vae-dtype: auto judges bf16 on a GPU box, float32 when asked, and a rank started
    from the same command line gets the same value."""
    from h3app.hardware import auto
    from h3app.hardware.flavors import flavor

    seen = []
    original = auto.best

    def spy(request, box, setup, *rest, **kwargs):
        seen.append(setup.vae_dtype)
        return original(request, box, setup, *rest, **kwargs)

    box = flavor("h200")
    for asked, expected in ((None, torch.bfloat16), ("auto", torch.bfloat16), ("float32", torch.float32)):
        seen.clear()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(auto, "best", spy)
            choice = auto.choose(auto.Serving(vae_dtype=asked), box)
        assert seen == [expected] and choice.verdict is not None
    assert auto.Serving(vae_dtype="float32").environment()["H3APP_VAE_DTYPE"] == "float32"
