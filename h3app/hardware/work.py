"""The arithmetic a rehearsal does: FLOPs per phase, per kind (the base model or a LoRA delta) and per precision.

``WorkCounter`` is torch's ``FlopCounterMode`` (its per-op formulas: matmuls, convolutions, fused attention), which
runs on fake tensors, entered on the thread that runs the request on top of fake CUDA. Each counted op is filed under
the innermost open phase of the rehearsal's ``ByteCounter`` (``denoise``, ``text_encoder``, ``vae_decode``…), under
``lora`` while a ``LoRAFactors.delta`` runs (else ``base``), and under the precision a GPU runs it in: the tensor's
dtype, or ``tf32`` for an fp32 op that PyTorch lets run on TF32 tensor cores (cuDNN convolutions by default,
matmuls only with ``torch.backends.cuda.matmul.allow_tf32``). Layers the rehearsal replays
(``replay.replay_repeats``) repeat their recorded counts, so every block is counted.

Every other op that runs on the GPU (norms, activations, residual adds, casts, RoPE, concatenations, the VAE's tile
blending) is memory-bound: it is filed, by phase and kind, as the bytes it moves (``moved``: its GPU inputs read and
outputs written, once each; a gather moves its output twice), as eager PyTorch dispatches it. Views, factories of
uninitialised memory and host tensors move nothing here.

The fused attention ops' FLOPs are also filed apart (``attention``: a subset of the FLOPs, by phase, kind and
precision), because an attention kernel reaches a different share of the tensor cores' peak than a GEMM, and that
share depends on the attention backend (``hardware/attention_speed.py``).

Every op that does work on the GPU (FLOPs or moved bytes) is also counted once (``ops``, by phase and kind): eager
PyTorch launches one kernel for each, and on a small model the fixed cost of each launch, not its FLOPs or bytes,
is what a step takes (``roofline.phase_seconds``' per-op term). Views and metadata launch nothing and are not
counted.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..lora import layers
from ..lora.layers import LoRAFactors
from ..model.torch_compat import CONVOLUTION_OPS as CONVOLUTIONS
from .replay import is_replay_phase

BASE, LORA = "base", "lora"
TF32 = "tf32"
OUTSIDE = "other"  # ops outside every named phase
MOVED = "moved"  # the snapshot key of memory-bound bytes (beside the precisions of FLOPs)
OPS = "ops"  # the snapshot key of the ops that did work (one kernel launch each)
ATTENTION_KEY = "attention:"  # the snapshot prefix of attention FLOPs (``attention:bfloat16``)
_aten = torch.ops.aten
_GATHERS = {_aten.embedding, _aten.index_select, _aten.gather, _aten.index, _aten.take}  # read ≈ what they write
# fused attention (its FLOPs filed apart as well): torch's FLOP formulas for forward attention kernels, by name
_ATTENTION = frozenset(op for op in FlopCounterMode().flop_registry
                       if "attention" in str(op) and "backward" not in str(op) and "flex" not in str(op))
_NO_DATA = {_aten.empty, _aten.empty_like, _aten.empty_strided, _aten.new_empty, _aten.new_empty_strided}

Flops = dict[str, dict[str, dict[str, int]]]  # phase → kind → precision → FLOPs


class WorkCounter(FlopCounterMode):
    """FLOPs by ``(phase, kind, precision)``; ``phases`` is the rehearsal's byte counter (its open phases)."""

    def __init__(self, phases: Any) -> None:
        super().__init__(display=False)
        self._phases = phases
        self.kind = BASE
        self.counts: dict[tuple[str, str, str], int] = defaultdict(int)
        self.attention: dict[tuple[str, str, str], int] = defaultdict(int)  # the fused attention ops' share of counts
        self.moved: dict[tuple[str, str], int] = defaultdict(int)  # (phase, kind) → bytes of memory-bound ops
        self.ops: dict[tuple[str, str], int] = defaultdict(int)  # (phase, kind) → ops that did work (kernels)

    def _phase(self) -> str:
        named = [name for name in self._phases.open_phases if not is_replay_phase(name)]
        return named[-1] if named else OUTSIDE

    def _count_flops(self, func_packet, out, args, kwargs):  # FlopCounterMode's hook for every counted op
        formula = self.flop_registry.get(func_packet)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
            if flops:
                key = (self._phase(), self.kind, precision(func_packet, _dtype_of(args)))
                self.counts[key] += flops
                if func_packet in _ATTENTION:
                    self.attention[key] += flops
                self.ops[(self._phase(), self.kind)] += 1
        else:
            moved = bytes_moved(func_packet, args, kwargs, out)
            if moved:
                self.moved[(self._phase(), self.kind)] += moved
                self.ops[(self._phase(), self.kind)] += 1
        return out

    # ---------------------------------------------------------------- replay (replay.replay_calls)
    def snapshot(self) -> dict[tuple[str, str], int]:
        """Totals by ``(kind, precision)`` (and ``(kind, MOVED)``: bytes, ``(kind, OPS)``: ops) over all phases, to
        diff a recorded call against."""
        totals: dict[tuple[str, str], int] = defaultdict(int)
        for (_, kind, prec), flops in self.counts.items():
            totals[(kind, prec)] += flops
        for (_, kind, prec), flops in self.attention.items():
            totals[(kind, ATTENTION_KEY + prec)] += flops
        for key, per_kind in ((MOVED, self.moved), (OPS, self.ops)):
            for (_, kind), count in per_kind.items():
                totals[(kind, key)] += count
        return dict(totals)

    def since(self, before: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
        """What was counted after ``before`` (a ``snapshot``)."""
        now = self.snapshot()
        return {key: flops - before.get(key, 0) for key, flops in now.items() if flops != before.get(key, 0)}

    def repeat(self, recorded: dict[tuple[str, str], int]) -> None:
        """Count a replayed call's recorded FLOPs again, in the phase open now."""
        phase = self._phase()
        for (kind, prec), count in recorded.items():
            if prec in (MOVED, OPS):
                (self.moved if prec == MOVED else self.ops)[(phase, kind)] += count
            elif prec.startswith(ATTENTION_KEY):
                self.attention[(phase, kind, prec.removeprefix(ATTENTION_KEY))] += count
            else:
                self.counts[(phase, kind, prec)] += count

    def by_phase(self) -> Flops:
        """``{phase: {kind: {precision: FLOPs}}}``."""
        return _flops_by_phase(self.counts)

    def attention_by_phase(self) -> Flops:
        """``{phase: {kind: {precision: FLOPs}}}`` of the fused attention ops alone (a subset of :meth:`by_phase`)."""
        return _flops_by_phase(self.attention)

    def moved_by_phase(self) -> dict[str, dict[str, int]]:
        """``{phase: {kind: bytes}}`` of the memory-bound ops."""
        return _by_phase(self.moved)

    def ops_by_phase(self) -> dict[str, dict[str, int]]:
        """``{phase: {kind: ops}}``: the ops that did work (FLOPs or moved bytes), one kernel launch each."""
        return _by_phase(self.ops)


def _flops_by_phase(counts: dict[tuple[str, str, str], int]) -> Flops:
    out: Flops = {}
    for (phase, kind, prec), flops in sorted(counts.items()):
        out.setdefault(phase, {}).setdefault(kind, {})[prec] = flops
    return out


def _by_phase(counts: dict[tuple[str, str], int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (phase, kind), count in sorted(counts.items()):
        out.setdefault(phase, {})[kind] = count
    return out


def bytes_moved(func_packet: Any, args: Any, kwargs: dict[str, Any], out: Any) -> int:
    """Bytes a memory-bound op moves through GPU memory: its GPU tensor inputs read and outputs written (a gather:
    its output twice); 0 for views, factories of uninitialised memory and ops that return no tensor (metadata)."""
    outputs = list(_tensors(out))
    if not outputs or func_packet in _NO_DATA or _is_view(func_packet):  # metadata (``prim.device``), views
        return 0
    written = sum(_gpu_bytes(t) for t in outputs)
    if func_packet in _GATHERS:
        return 2 * written
    return written + sum(_gpu_bytes(t) for t in _tensors((args, kwargs)))


def _is_view(func_packet: Any) -> bool:
    overloads: Sequence[str] = func_packet.overloads() if hasattr(func_packet, "overloads") else ()
    return bool(overloads) and getattr(func_packet, overloads[0]).is_view


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _gpu_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size() if tensor.device.type == "cuda" else 0


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
    rehearsal's ``ByteCounter``) also carries for replays; LoRA deltas (with their input's cast and the add into the
    base output) are filed under ``lora``."""
    work = WorkCounter(phases)
    # the delta, and the input's cast and the add into the output (``add_deltas``): the LoRA's work
    counted_as_lora: list[tuple[object, str]] = [(LoRAFactors, "delta"), (layers, "add_deltas")]
    originals = [(owner, name, getattr(owner, name)) for owner, name in counted_as_lora]

    def as_lora(function: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            outer, work.kind = work.kind, LORA
            try:
                return function(*args, **kwargs)
            finally:
                work.kind = outer

        return counted

    phases.work = work
    for owner, name, original in originals:
        setattr(owner, name, as_lora(original))
    try:
        with work:
            yield work
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
        phases.work = None


def moved_total(moved: dict[str, dict[str, int]], phase: str, kinds: tuple[str, ...] = (BASE, LORA)) -> int:
    """Bytes the memory-bound ops of ``phase`` moved (or, given ``Rehearsal.ops``, the ops it ran), summed over
    ``kinds``."""
    return sum(moved.get(phase, {}).get(kind, 0) for kind in kinds)


def total(flops: Flops, phase: str, kinds: tuple[str, ...] = (BASE, LORA)) -> dict[str, int]:
    """FLOPs of ``phase`` by precision, summed over ``kinds``."""
    out: dict[str, int] = defaultdict(int)
    for kind in kinds:
        for prec, count in flops.get(phase, {}).get(kind, {}).items():
            out[prec] += count
    return dict(out)
