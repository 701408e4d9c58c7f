"""The time (and $) of a request on the box the app runs on, before the click: the judge's prediction, nothing else.

:class:`TimeModel` is what ``app.py`` gives the backend (``Backend.time_model``) so that the UI can say, for the
request as it stands, how long it will take and what it costs. It asks :func:`judge.judge` — the same judgement
the plan prints (``plan --json``'s ``video_s``, ``decode_s``…) — for this model, setup, placement and box. On a GPU
the box is the one this process sees (spec-sheet peaks, ``roofline.PEAKS``); on a CPU there is no spec sheet, so
the rates come from :func:`cpu_peaks`, measured once at start-up (a float32 and a bfloat16 matmul, a copy, the
fixed cost of one small op). A
request's canvas and length are rehearsed once each (``planner.measure``, a few seconds on the tiny model); steps
and the step cache change only the sum, not the rehearsal.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..rules.attention import AUTO
from ..rules.frames import RELEASED
from ..rules.request_defaults import defaults_for
from .flavors import Flavor
from .judge import PlannedRequest, Setup, judge
from .planner import Placement
from .roofline import PCIE4, Peaks

CPU = "CPU"
MATMUL_SIDE = 512  # a square matmul big enough to run at the CPU's GEMM rate, small enough for ~10 ms
COPY_BYTES = 64 * 2**20  # larger than the caches: what a copy moves through RAM
SMALL_ROWS, SMALL_WIDTH = 16, 32  # tensors so small that an op's fixed cost, not its arithmetic, is its time
SMALL_REPEATS = 200  # passes of the small block per timed run (~10 ms)


def _rate(work: float, run: Any, repeats: int = 5) -> float:
    """``work`` per second of the fastest of ``repeats`` runs of ``run`` (after one warm-up)."""
    run()
    best = min(_timed(run) for _ in range(repeats))
    return work / max(best, 1e-9)


def _timed(run: Any) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


class _SmallBlock(torch.nn.Module):
    """The ops a transformer block is made of, on tiny tensors: a norm, a Linear, an activation, a Linear, a residual
    add and a scale — :data:`SMALL_BLOCK_OPS` ops that each do work (``work.py`` counts each once), run through
    ``nn.Module`` calls as the model runs them."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(SMALL_WIDTH)
        self.up, self.down = torch.nn.Linear(SMALL_WIDTH, SMALL_WIDTH), torch.nn.Linear(SMALL_WIDTH, SMALL_WIDTH)
        self.act = torch.nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + self.down(self.act(self.up(self.norm(x))))) * 0.5


SMALL_BLOCK_OPS = 6  # layer_norm, addmm, silu, addmm, add, mul


def op_overhead() -> float:
    """Seconds one op costs on this CPU when its tensors are tiny: the best of a few runs of :class:`_SmallBlock`
    (``SMALL_REPEATS`` passes) over its ops. Eager PyTorch's dispatch and the Python around each call, which on a
    small model is most of a step."""
    block, x = _SmallBlock().eval(), torch.randn(SMALL_ROWS, SMALL_WIDTH)

    def passes() -> None:
        with torch.inference_mode():
            for _ in range(SMALL_REPEATS):
                block(x)

    return 1.0 / _rate(SMALL_REPEATS * SMALL_BLOCK_OPS, passes)


def cpu_peaks() -> Peaks:
    """This CPU's rates as :class:`roofline.Peaks`: FLOP/s of a float32 and a bfloat16 matmul (fp32 convolutions run
    in fp32 here, no TF32), the bytes/s a copy moves (read + write) and the seconds one small op costs
    (:func:`op_overhead`). Measured, never looked up; ~0.4 s. Rates a kernel reached here take no efficiency
    factor (the GPU's efficiencies are the share of a spec sheet real kernels reach)."""
    side = MATMUL_SIDE
    flops = 2.0 * side**3
    rates = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(side, side, dtype=dtype), torch.randn(side, side, dtype=dtype)
        rates[dtype] = _rate(flops, lambda a=a, b=b: a @ b) / 1e12
    source = torch.empty(COPY_BYTES // 4, dtype=torch.float32)
    target = torch.empty_like(source)
    memory = _rate(2.0 * COPY_BYTES, lambda: target.copy_(source)) / 1e12
    fp32 = rates[torch.float32]
    return Peaks(CPU, bf16=rates[torch.bfloat16], fp8=None, tf32=fp32, fp32=fp32, memory_tbps=memory,
                 host_gbps=PCIE4, op_overhead_s=op_overhead(),  # host_gbps: offload is a GPU placement; unused here
                 gemm_efficiency=1.0, memory_efficiency=1.0)


def cpu_box() -> Flavor:
    """This machine as a box without a GPU: its RAM on both sides, no price."""
    from .preflight import host_ram

    ram = host_ram() or 0
    return Flavor("this CPU", CPU, 1, ram, ram or None, os.cpu_count(), None, None)


def planned(request: Any, model: str) -> PlannedRequest:
    """The judge's request for a ``GenerationRequest``: its canvas (the model's default when unset), frames, steps
    and step cache."""
    height, width = defaults_for(model).planned_canvas
    return PlannedRequest(request.workflow, int(request.height or height), int(request.width or width),
                          RELEASED.frames(float(request.duration)), int(request.steps), request.cache)


@dataclass
class TimeModel:
    """The judge's prediction for ``model`` (``full`` or ``tiny``) with ``setup`` and ``placement`` on ``box``;
    ``peaks`` None: the box's spec sheet, else rates measured here. Thread-safe; each canvas and length is rehearsed
    once in this process (``planner.measure`` keeps it), so asking again only sums."""

    model: str
    setup: Setup
    placement: Placement
    box: Flavor
    peaks: Peaks | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(self, request: Any) -> dict[str, Any] | None:
        """``GenerationRequest`` → the prediction (``roofline.predict_one``'s fields: ``video_s``, ``step_s``,
        ``decode_s``, ``usd_per_video``…) with ``box`` (its words) and ``measured_rates`` (True on a CPU);
        None where this box has no rates."""
        target = planned(request, self.model)
        with self._lock:  # one rehearsal at a time; a second asker of the same request waits for the first's
            verdict = judge(target, self.placement, self.box, self.setup, peaks=self.peaks)
        if not verdict.prediction:
            return None
        return {**verdict.prediction, "box": self.box.label if self.box.gpu != CPU else "this CPU",
                "measured_rates": self.peaks is not None, "request": target.to_json()}


def for_app(model: str, options: Any, ranks: int = 1, ring: int = 1) -> TimeModel:
    """The app's time model: ``options`` (``LoadOptions``) judged on this box — its GPUs, or this CPU at rates
    measured now (``cpu_peaks``)."""
    from ..model import repo
    from .preflight import placement_of, setup_of, this_box

    setup = setup_of(options)
    setup = Setup(model=repo.TINY if model == repo.TINY else setup.model, dtype=setup.dtype,
                  vae_dtype=setup.vae_dtype, fuse_qkv=setup.fuse_qkv)
    gpu = this_box() if str(options.device).startswith("cuda") else None
    if gpu is None:
        return TimeModel(setup.model, setup, placement_of(options, ranks, ring), cpu_box(), cpu_peaks())
    from ..model.attention import chosen

    # the backend this box runs (what is installed here), where the plan assumes the card's pick is installed
    backend = chosen(options.device, options.dtype, getattr(options, "attention", AUTO), getattr(options, "split", ""))
    return TimeModel(setup.model, replace(setup, attention=backend.name), placement_of(options, ranks, ring), gpu)
