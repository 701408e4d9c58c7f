"""bench/gpu.py --decode and the step-cache rows of --speed (bench/gpu_decode_cache.py) on the CPU: the measuring code
run on tiny models, the rows and the table (no timing asserted)."""

from __future__ import annotations

import json
import time

import torch

from bench.gpu_decode_cache import Row, cache_rows, decode_rows, predicted_decode, table
from h3app.model import repo


def timer(operation):
    started = time.perf_counter()
    operation()
    return time.perf_counter() - started


def test_the_decode_rows_time_fp32_then_bf16_with_the_islands_kept_and_compare_them():
    from diffusers import AutoencoderKLMiniMaxH3

    config = json.loads((repo.TINY_DIR / "vae" / "config.json").read_text())
    vae = AutoencoderKLMiniMaxH3(**{k: v for k, v in config.items() if not k.startswith("_")}).eval()
    latents = torch.randn(1, vae.config.latent_channels, 7, 4, 4, generator=torch.Generator().manual_seed(0))
    asked = []
    rows = decode_rows(vae, latents, timer, lambda dtype: asked.append(dtype) or 2.0)
    assert asked == [torch.float32, torch.bfloat16]
    assert [r.what for r in rows] == ["video decode, decoder in float32", "video decode, decoder in bfloat16",
                                      "bf16 vs fp32 frames (random weights)"]
    assert all(r.measured_s is not None and r.measured_s > 0 and r.predicted_s == 2.0 for r in rows[:2])
    assert rows[2].note.startswith("PSNR ") and "inf" not in rows[2].note  # bf16 moved the numbers, a little
    block = vae.decoder.transformer_blocks[0]
    assert block.attn.to_q.weight.dtype == torch.bfloat16 and block.norm1.weight.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in vae.encoder.parameters())


def test_the_cache_rows_time_a_full_and_a_skipped_evaluation():
    from bench.gpu import build_full_size
    from h3app.backend.transformer_check import packed_check_input
    from h3app.model.tiny import TINY_TRANSFORMER_CONFIG

    model = build_full_size("cpu", dict(TINY_TRANSFORMER_CONFIG))
    inputs = packed_check_input(model.config, seed=0)

    def step():
        with torch.no_grad():
            return model(**inputs)

    rows = cache_rows(model, step, timer, {"step_s": 1.0, "skipped_step_s": 0.5})
    assert [r.predicted_s for r in rows] == [1.0, 0.5] and all(r.measured_s > 0 for r in rows)
    assert rows[1].note.endswith("evaluations skipped") and not rows[1].note.startswith("0 of")
    assert not model.is_cache_enabled  # the hooks are gone


def test_the_table_and_an_unknown_gpu():
    text = table([Row("a", 1.0, 0.5), Row("b", None, None, "why")])
    header = [cell.strip() for cell in text.splitlines()[0].strip("|").split("|")]
    assert header.index("measured") == header.index("predicted") + 1
    assert "| a | 1.000 s | 0.500 s | 0.50× |  |" in text and "| b | — | — | — | why |" in text
    assert predicted_decode("Tesla T4", torch.bfloat16) is None  # no spec-sheet peaks: no prediction
