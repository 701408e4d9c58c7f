"""``python -m bench.gpu --decode`` and the step-cache rows of ``--speed``: the video decode in fp32 and in bf16
(``--vae-dtype``), and an evaluation the first-block cache skips, each measured beside the plan's prediction.

**Decode.** diffusers' ``AutoencoderKLMiniMaxH3()`` at the released config (a 36-layer ViT decoder, 2.4 B
parameters) with random weights, built on the GPU in float32, decodes the latents of a 768×768, 124-frame request
(37 × 48 × 48, tiled as released: 16 tiles × 7 clips); then the same weights in bf16 with diffusers' float32 islands
(norms, encoder), as ``--vae-dtype bfloat16`` loads them. Predicted: the plan's ``vae_decode`` phase for that dtype
(``h3app.hardware.roofline.once_seconds`` on the full-size rehearsal's counts for this GPU's peaks, one rank). The PSNR of
the bf16 frames against the fp32 ones is on random weights: how far bf16 rounding moves this decoder's numbers, not a
verdict on a trained one.

**Step cache.** One transformer evaluation with every block, and one the first-block cache skips (the leader block
runs, the others reuse the residual: threshold set so that every evaluation after the first skips), against the
roofline's ``step_s`` and ``skipped_step_s``.

The row building runs anywhere; measuring needs CUDA (``tests/test_bench_gpu_decode_cache.py`` runs the measuring
code on the CPU with tiny models, no timing asserted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DECODE_SIZE = (768, 768)
VAE_DTYPES = ("float32", "bfloat16")


@dataclass
class Row:
    """One measured thing beside its prediction (seconds; None where there is none, ``note`` says why)."""

    what: str
    predicted_s: float | None
    measured_s: float | None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return self.measured_s / self.predicted_s if self.predicted_s and self.measured_s is not None else None


def table(rows: list[Row]) -> str:
    """Predicted and measured in adjacent columns, then their ratio."""
    def shown(seconds: float | None) -> str:
        return "—" if seconds is None else f"{seconds:.3f} s"

    lines = ["| what | predicted | measured | measured / predicted | note |", "|---|---|---|---|---|"]
    lines += [f"| {r.what} | {shown(r.predicted_s)} | {shown(r.measured_s)} | "
              f"{'—' if r.ratio is None else f'{r.ratio:.2f}×'} | {r.note} |" for r in rows]
    return "\n".join(lines)


def predicted_decode(gpu_name: str, vae_dtype: Any, size: tuple[int, int] = DECODE_SIZE,
                     frames: int = 124) -> float | None:
    """The plan's video-decode seconds (the ``vae_decode`` phase) of a ``size`` × ``frames`` request on
    ``gpu_name`` with the video decoder in ``vae_dtype``; None without spec-sheet peaks for the GPU."""
    from h3app.hardware.judge import PlannedRequest, Setup, measured_for
    from h3app.hardware.planner import Placement
    from h3app.hardware.roofline import once_seconds, peaks_for_device
    from h3app.rules.choices import T2VA

    peaks = peaks_for_device(gpu_name)
    if peaks is None:
        return None
    measured = measured_for(PlannedRequest(T2VA, *size, frames, 2), Setup(vae_dtype=vae_dtype))
    return once_seconds(measured, Placement(), peaks)["vae_decode"]  # the plan's own term, on one rank


def decode_rows(vae: Any, latents: Any, timer: Callable[[Callable[[], Any]], float],
                predicted: Callable[[Any], float | None]) -> list[Row]:
    """Time ``vae.decode(latents)`` in float32, then with ``vae`` cast to bf16 keeping diffusers' fp32 islands;
    ``predicted(dtype)`` gives each row's prediction. The last row: PSNR of the bf16 frames against the fp32 ones."""
    import torch

    from h3app.backend.metrics import psnr
    from h3app.hardware.full_size import to_dtype_keeping_islands

    rows, frames = [], {}
    for name in VAE_DTYPES:
        dtype = getattr(torch, name)
        to_dtype_keeping_islands(vae, dtype)

        def decode(name: str = name) -> Any:
            with torch.no_grad():
                frames[name] = vae.decode(latents, return_dict=False)[0]

        rows.append(Row(f"video decode, decoder in {name}", predicted(dtype), float(timer(decode))))
    fp32, bf16 = (frames[name].float().clamp(-3, 3).cpu().numpy() for name in VAE_DTYPES)
    rows.append(Row("bf16 vs fp32 frames (random weights)", None, None,
                    f"PSNR {psnr(fp32 / 6 + 0.5, bf16 / 6 + 0.5):.1f} dB over the ImageNet-normalised range"))
    return rows


def cache_rows(model: Any, step: Callable[[], Any], timer: Callable[[Callable[[], Any]], float],
               predicted: dict[str, float | None]) -> list[Row]:
    """One evaluation of ``model`` with every block, and one the first-block cache skips (``predicted``: the
    roofline's ``step_s`` and ``skipped_step_s``)."""
    from h3app.model.denoise_cache import first_block_cache

    full = float(timer(step))
    with first_block_cache(model, threshold=1e9) as count:
        step()  # the first evaluation computes every block: the residual to reuse
        skipped = float(timer(step))
    note = f"{count.skipped} of {count.evaluations} evaluations skipped"
    return [Row("one evaluation, every block", predicted.get("step_s"), full),
            Row("one evaluation the step cache skips", predicted.get("skipped_step_s"), skipped, note)]


def build_vae(device: Any) -> Any:
    """diffusers' released video VAE config, random weights, float32, on ``device``."""
    import torch
    from diffusers import AutoencoderKLMiniMaxH3

    with torch.device(device):
        return AutoencoderKLMiniMaxH3().eval().requires_grad_(False)


def run_decode(args: Any, device: Any) -> str:
    """The whole ``--decode`` run on ``device``; returns the table."""
    import torch

    from h3app.rules.frames import RELEASED

    vae = build_vae(device)
    height, width = DECODE_SIZE
    latent_frames = (RELEASED.frames(RELEASED.shortest_seconds) - 5) // 17 * 5 + 2
    latents = torch.randn(1, vae.config.latent_channels, latent_frames, height // 16, width // 16, device=device)
    name = torch.cuda.get_device_properties(device).name
    from .gpu_common import time_cuda

    rows = decode_rows(vae, latents, lambda op: time_cuda(op, max(1, args.repeats // 3)),
                       lambda dtype: predicted_decode(name, dtype))
    return table(rows)
