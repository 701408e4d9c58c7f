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
