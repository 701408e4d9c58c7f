"""What the GPU benchmarks share (``bench/gpu.py``, ``gpu_parallel.py``, ``gpu_speed.py``): the request sizes, the
adapter's rank, the full-size transformer built on a device, and the CUDA timers."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

RESOLUTIONS: dict[str, tuple[int, int]] = {"544p": (544, 960), "768p": (768, 1344)}
RANK = 128
ADAPTER = "bench"


def cuda_device(name: str) -> Any:
    """The CUDA device to run on, or None when CUDA is not available (or ``name`` is not a CUDA device)."""
    import torch

    if not name.startswith("cuda") or not torch.cuda.is_available():
        return None
    return torch.device(name)


def build_full_size(device: Any, config: dict[str, Any] | None = None) -> Any:
    """diffusers' H3 transformer (full size unless ``config`` says otherwise), bf16, random weights, allocated
    directly on ``device``; the float32 islands diffusers keeps (``_keep_in_fp32_modules``) stay float32."""
    import torch
    from diffusers import MiniMaxH3Transformer3DModel

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # allocate bf16 directly: an fp32 build would need 124 GB
    try:
        with torch.device(device):
            model = MiniMaxH3Transformer3DModel(**(config or {}))
    finally:
        torch.set_default_dtype(previous)
    keep = tuple(model._keep_in_fp32_modules)
    for name, module in model.named_modules():
        if name and any(pattern in name for pattern in keep):
            module.to(torch.float32)
    model.rope.inv_freq = model.rope.inv_freq.float()
    return model.eval().requires_grad_(False)


def time_cuda(operation: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    """Median seconds of ``operation`` between synchronised CUDA events."""
    import torch

    for _ in range(warmup):
        operation()
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        operation()
        end.record()
        torch.cuda.synchronize()
        runs.append(start.elapsed_time(end) / 1e3)
    return statistics.median(runs)


def time_host(operation: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    """Median wall seconds of ``operation`` (synchronised), for host-side work such as attach."""
    import torch

    for _ in range(warmup):
        operation()
    runs = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        operation()
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)
