"""The arithmetic a rehearsal does: FLOPs per phase, per kind (the base model or a LoRA delta) and per precision.

``WorkCounter`` is torch's ``FlopCounterMode`` (its per-op formulas: matmuls, convolutions, fused attention), which
runs on fake tensors, entered on the thread that runs the request on top of fake CUDA. Each counted op is filed under
the innermost open phase of the rehearsal's ``ByteCounter`` (``denoise``, ``text_encoder``, ``vae_decode``…), under
``lora`` while a ``LoRAFactors.delta`` runs (else ``base``), and under the precision a GPU runs it in: the tensor's
dtype, or ``tf32`` for an fp32 op that PyTorch lets run on TF32 tensor cores (cuDNN convolutions by default,
matmuls only with ``torch.backends.cuda.matmul.allow_tf32``). Layers the rehearsal replays
(``fake_cuda.replay_repeats``) repeat their recorded counts, so every block is counted.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..lora.layers import LoRAFactors
from ..model.torch_compat import CONVOLUTION_OPS as CONVOLUTIONS

BASE, LORA = "base", "lora"
TF32 = "tf32"
OUTSIDE = "other"  # ops outside every named phase

Flops = dict[str, dict[str, dict[str, int]]]  # phase → kind → precision → FLOPs


class WorkCounter(FlopCounterMode):
    """FLOPs by ``(phase, kind, precision)``; ``phases`` is the rehearsal's byte counter (its open phases)."""

    def __init__(self, phases: Any) -> None:
        super().__init__(display=False)
        self._phases = phases
        self.kind = BASE
        self.counts: dict[tuple[str, str, str], int] = defaultdict(int)

    def _phase(self) -> str:
        named = [name for name in self._phases.open_phases if name != "replayed"]
        return named[-1] if named else OUTSIDE

    def _count_flops(self, func_packet, out, args, kwargs):  # FlopCounterMode's hook for every counted op
        formula = self.flop_registry.get(func_packet)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
            if flops:
                self.counts[(self._phase(), self.kind, precision(func_packet, _dtype_of(args)))] += flops
        return out

    # ---------------------------------------------------------------- replay (fake_cuda.replay_repeats)
    def snapshot(self) -> dict[tuple[str, str], int]:
        """Totals by ``(kind, precision)`` over all phases, to diff a recorded call against."""
        totals: dict[tuple[str, str], int] = defaultdict(int)
        for (_, kind, prec), flops in self.counts.items():
            totals[(kind, prec)] += flops
        return dict(totals)

    def since(self, before: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
        """What was counted after ``before`` (a ``snapshot``)."""
        now = self.snapshot()
        return {key: flops - before.get(key, 0) for key, flops in now.items() if flops != before.get(key, 0)}

    def repeat(self, recorded: dict[tuple[str, str], int]) -> None:
        """Count a replayed call's recorded FLOPs again, in the phase open now."""
        phase = self._phase()
        for (kind, prec), flops in recorded.items():
            self.counts[(phase, kind, prec)] += flops

    def by_phase(self) -> Flops:
        """``{phase: {kind: {precision: FLOPs}}}``."""
        out: Flops = {}
        for (phase, kind, prec), flops in sorted(self.counts.items()):
            out.setdefault(phase, {}).setdefault(kind, {})[prec] = flops
        return out


def precision(func_packet: Any, dtype: torch.dtype | None) -> str:
    """What a GPU runs an op of ``dtype`` in: its dtype's name, or ``tf32`` where PyTorch allows TF32 for it."""
    if dtype == torch.float32:
        if func_packet in CONVOLUTIONS and torch.backends.cudnn.allow_tf32:
            return TF32
        if func_packet not in CONVOLUTIONS and torch.backends.cuda.matmul.allow_tf32:
            return TF32
    return str(dtype).replace("torch.", "") if dtype is not None else "unknown"


def _dtype_of(args: Any) -> torch.dtype | None:
    for value in args:
        if isinstance(value, torch.Tensor):
            return value.dtype
    return None


@contextlib.contextmanager
def counting(phases: Any) -> Iterator[WorkCounter]:
    """Count FLOPs on this thread (enter it inside fake CUDA) into a new ``WorkCounter`` that ``phases`` (the
    rehearsal's ``ByteCounter``) also carries for replays; LoRA deltas are filed under ``lora``."""
    work = WorkCounter(phases)
    original = LoRAFactors.delta

    def delta(self: LoRAFactors, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        outer, work.kind = work.kind, LORA
        try:
            return original(self, x, *args, **kwargs)
        finally:
            work.kind = outer

    phases.work = work
    LoRAFactors.delta = delta
    try:
        with work:
            yield work
    finally:
        LoRAFactors.delta = original
        phases.work = None


def total(flops: Flops, phase: str, kinds: tuple[str, ...] = (BASE, LORA)) -> dict[str, int]:
    """FLOPs of ``phase`` by precision, summed over ``kinds``."""
    out: dict[str, int] = defaultdict(int)
    for kind in kinds:
        for prec, count in flops.get(phase, {}).get(kind, {}).items():
            out[prec] += count
    return dict(out)
