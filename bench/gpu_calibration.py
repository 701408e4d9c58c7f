"""``python -m bench.gpu --calibration``: the configurations of docs/hardware.md's calibration table that one card
can run, measured beside the plan's prediction for this card — the published request (t2va, 1344×768, 124 frames,
bf16) on one rank.

Rows: one transformer evaluation (bf16, eager, no LoRA) with the attention backend the app picks on this card
(``h3app.model.attention.chosen`` + ``apply``, the loader's own rule) and again with SDPA — the two attention rates the
plan counts (``hardware/attention_speed.py``); then the video decode of the request's latents with the decoder in
fp32 and in bf16 (``bench/gpu_decode_cache.decode_rows``). Each prediction is the plan's own: ``roofline.step_seconds``
and ``roofline.once_seconds`` on the full-size rehearsal of that request (fake CUDA), for this GPU's peaks. The
multi-rank rows of the table (Ulysses over 4 or 8 GPUs, the decode's tiles over ranks) need as many cards: a one-card
box measures the per-GPU rates they are built from. ``measured / predicted`` is the calibration's next column.

The row building runs anywhere (``tests/test_bench_gpu_calibration.py``); measuring needs CUDA.
"""

from __future__ import annotations

from typing import Any

from .gpu_decode_cache import Row, decode_rows, table

REQUEST_SIZE = (768, 1344)  # (height, width) of the published request
SDPA_NAME = "sdpa"


def predictions(gpu_name: str, backend_name: str, frames: int = 124) -> dict[str, float | None]:
    """The plan's one-rank seconds on ``gpu_name`` for the published request: ``step`` with ``backend_name``'s
    attention, ``step_sdpa`` with SDPA, and ``decode_<dtype>`` per decoder dtype (None without spec-sheet peaks)."""
    import torch

    from h3app.hardware.judge import PlannedRequest, Setup, measured_for
    from h3app.hardware.planner import Placement
    from h3app.hardware.roofline import once_seconds, peaks_for_device, step_seconds
    from h3app.rules.attention import BY_NAME
    from h3app.rules.choices import T2VA

    peaks = peaks_for_device(gpu_name)
    out: dict[str, float | None] = {"step": None, "step_sdpa": None, "decode_float32": None, "decode_bfloat16": None}
    if peaks is None:
        return out
    request = PlannedRequest(T2VA, *REQUEST_SIZE, frames, 2)
    for dtype in ("float32", "bfloat16"):
        measured = measured_for(request, Setup(vae_dtype=getattr(torch, dtype)))
        out[f"decode_{dtype}"] = once_seconds(measured, Placement(), peaks)["vae_decode"]
    # the step does not depend on the decoder's dtype: the last rehearsal serves
    out["step"] = step_seconds(measured, Placement(), peaks, None, BY_NAME[backend_name])
    out["step_sdpa"] = step_seconds(measured, Placement(), peaks, None, BY_NAME[SDPA_NAME])
    return out


def step_rows(step: Any, use_backend: Any, backend_name: str, timer: Any, predicted: dict[str, float | None]
              ) -> list[Row]:
    """One evaluation with ``backend_name`` (already set), then with SDPA (``use_backend("sdpa")`` sets it)."""
    rows = [Row(f"one evaluation, 1344×768, 124 frames, attention {backend_name}", predicted["step"],
                float(timer(step)), "the backend the app picks on this card")]
    if backend_name != SDPA_NAME:
        use_backend(SDPA_NAME)
        rows.append(Row("one evaluation, attention sdpa", predicted["step_sdpa"], float(timer(step)),
                        "what a box without the backend's package runs"))
    return rows


def run_calibration(args: Any, device: Any) -> str:
    """The whole ``--calibration`` run on ``device``: the full-size transformer's evaluations, then (the transformer
    freed) the video decode; returns the table."""
    import torch

    from h3app.model import attention

    from .gpu_common import time_cuda
    from .gpu_decode_cache import build_vae

    name = torch.cuda.get_device_properties(device).name
    backend = attention.chosen(str(device), torch.bfloat16)
    predicted = predictions(name, backend.name, args.frames)
    rows = transformer_rows(args, device, backend, predicted)
    torch.cuda.empty_cache()  # the transformer is gone with transformer_rows' frame
    vae = build_vae(device)
    height, width = REQUEST_SIZE
    latent_frames = (args.frames - 5) // 17 * 5 + 2  # as bench/gpu_decode_cache.run_decode: 37 for 124 frames
    latents = torch.randn(1, vae.config.latent_channels, latent_frames, height // 16, width // 16, device=device)
    rows += decode_rows(vae, latents, lambda op: time_cuda(op, max(1, args.repeats // 3)),
                        lambda dtype: predicted[f"decode_{str(dtype).removeprefix('torch.')}"])
    return table(rows)


def transformer_rows(args: Any, device: Any, backend: Any, predicted: dict[str, float | None]) -> list[Row]:
    """The full-size bf16 transformer built on ``device`` with ``backend`` set (the loader's ``attention.apply``),
    timed on the published request's packed rows, then with SDPA."""
    import torch

    from h3app.model import attention

    from .gpu_common import build_full_size, time_cuda
    from .models import full_size_batch

    model = build_full_size(device)
    attention.apply(model, backend)
    height, width = REQUEST_SIZE
    seq, batch = full_size_batch(height, width, args.frames, args.text_rows, device)

    def step() -> Any:
        with torch.no_grad():
            return model(**batch)

    def use(name: str) -> None:  # SDPA is diffusers' default: ``apply`` sets nothing for it, so set it here
        model.set_attention_backend(attention.chosen(str(device), torch.bfloat16, name).dispatcher)

    return step_rows(step, use, backend.name, lambda op: time_cuda(op, args.repeats), predicted)
