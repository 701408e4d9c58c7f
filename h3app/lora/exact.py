"""Exact parts on the held transformer: the entries that write a delta, a replacement or a head into one parameter,
and the checks run before any of them is bound.

Every exact part is written **into the parameter, in place, from its pristine copy**, in both LoRA modes:
``P = P0 + Σ strength · Δ`` (fp32, rounded once into the parameter's dtype) or ``P = R`` for a replacement. A Linear
weight's entries sit on its ``LoRALinear`` (``exact_entries``) and are written by the same chunked merge as a merged
LoRA (``BoundLayers``); biases and norm weights are written by ``ParamPatches``. Why not a wrapper in unmerged mode:
docs/lora-engine.md ("Exact parts").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from ..adapters.parts import HEAD_BANK, REPLACEMENTS
from ..adapters.types import ExactPart, HeadBank, NormalisedAdapter
from ..errors import H3AppError
from .layers import FP8_DTYPES, is_mergeable
from .targets import TargetSlot


class PartStrength:
    """The strength one adapter's deltas run at: its strength, unless pinned (``exact_strength``), times the strength
    schedule's factor of the evaluation now running (``step``, 1 between runs)."""

    def __init__(self, strength: float, pinned: float | None = None) -> None:
        self.strength = float(strength)
        self.pinned = pinned
        self.step = 1.0

    @property
    def value(self) -> float:
        return (self.strength if self.pinned is None else float(self.pinned)) * self.step


class ExactEntry:
    """One adapter's exact part on one parameter: ``tensor`` on the parameter's device (fp32 for a delta, the
    parameter's dtype for a replacement)."""

    def __init__(self, adapter: str, part: ExactPart, tensor: torch.Tensor, strength: PartStrength) -> None:
        self.adapter = adapter
        self.parameter = part.parameter
        self.kind = part.kind
        self.replaces = part.kind in REPLACEMENTS
        self.tensor = tensor
        self.strength = strength

    def apply(self, value32: torch.Tensor, start: int, stop: int) -> None:
        """Put this part into rows ``[start, stop)`` of the parameter's fp32 value."""
        if self.replaces:
            value32.copy_(self.tensor[start:stop])
        else:
            value32.add_(self.tensor[start:stop], alpha=self.strength.value)

    @property
    def nbytes(self) -> int:
        return self.tensor.nbytes


class BankHead:
    """The head a bank puts into ``parameter`` at the current evaluation (``current``); None between runs, when the
    parameter holds its original value."""

    replaces = True

    def __init__(self, adapter: str, parameter: str, bank: torch.Tensor) -> None:
        self.adapter = adapter
        self.parameter = parameter
        self.kind = HEAD_BANK
        self.bank = bank  # [n, out, in] or [n, out], fp32 on the parameter's device
        self.current: torch.Tensor | None = None

    def select(self, weights: torch.Tensor) -> None:
        """``current = Σ_k weights[k] · bank[k]`` (fp32, over the heads with a weight)."""
        used = torch.nonzero(weights).flatten()
        self.current = torch.tensordot(weights[used].to(self.bank.device), self.bank[used], dims=1)

    def apply(self, value32: torch.Tensor, start: int, stop: int) -> None:
        if self.current is not None:
            value32.copy_(self.current[start:stop])

    @property
    def nbytes(self) -> int:
        return self.bank.nbytes


@dataclass
class ExactPlan:
    """An adapter's exact entries, checked: Linear weights (by module path) and other parameters (by name)."""

    linear: dict[str, list[ExactEntry | BankHead]] = field(default_factory=dict)
    params: dict[str, list[ExactEntry | BankHead]] = field(default_factory=dict)
    banks: dict[str, tuple[BankHead, BankHead | None]] = field(default_factory=dict)
    strength: PartStrength | None = None

    @property
    def has_deltas(self) -> bool:
        return any(not e.replaces for entries in (*self.linear.values(), *self.params.values()) for e in entries)


def parameter_of(transformer: torch.nn.Module, name: str) -> torch.Tensor | None:
    """The parameter ``name`` (a wrapped Linear's through its base), or None when the model has none."""
    from .layers import LoRALinear

    module_path, _, attr = name.rpartition(".")
    try:
        module = transformer.get_submodule(module_path)
    except AttributeError:
        return None
    if isinstance(module, LoRALinear):
        module = module.base
    value = getattr(module, attr, None)
    return value if isinstance(value, torch.Tensor) else None


def _check_writable(adapter: str, name: str, tensor: torch.Tensor) -> None:
    if tensor.dtype in FP8_DTYPES:
        raise H3AppError(f"adapter {adapter!r} changes {name} exactly, but the model stores it in {tensor.dtype} "
                         "(--fp8): the exact part would round into it; load without --fp8.")
    reason = is_mergeable(tensor)
    if reason:
        raise H3AppError(f"adapter {adapter!r} changes {name} exactly, in place, but {reason}; nothing was applied.")


def plan_exact(name: str, adapter: NormalisedAdapter, transformer: torch.nn.Module, slots: Mapping[str, TargetSlot],
               strength: PartStrength, taken: Mapping[str, Iterable[tuple[str, bool]]]) -> ExactPlan:
    """Check every exact part and head bank of ``adapter`` against the model and the adapters already attached
    (``taken``: parameter → ``(adapter, replaces)`` of what already changes it) and build its entries on each
    parameter's device. ``H3AppError`` (one line) for: a parameter the model lacks, a fused one, a shape that does not
    fit, two replacements of one parameter (or a replacement beside another change), a parameter that cannot be
    written in place."""
    plan = ExactPlan(strength=strength)
    for parameter, part in adapter.parts.items():
        replaces = part.kind in REPLACEMENTS
        target = _check_part(name, parameter, part.tensor.shape, transformer, slots, taken, replaces)
        dtype = target.dtype if replaces else torch.float32
        entry = ExactEntry(name, part, part.tensor.detach().to(device=target.device, dtype=dtype).contiguous(), strength)
        _place(plan, parameter, entry, slots)
    for module, bank in adapter.banks.items():
        plan.banks[module] = _bank_entries(name, module, bank, transformer, slots, taken, plan)
    return plan


def _check_part(name: str, parameter: str, shape: torch.Size, transformer: torch.nn.Module,
                slots: Mapping[str, TargetSlot], taken: Mapping[str, Iterable[tuple[str, bool]]],
                replaces: bool) -> torch.Tensor:
    module = parameter.rpartition(".")[0]
    slot = slots.get(module)
    if slot is not None and slot.groups > 1:
        raise H3AppError(f"adapter {name!r} changes {parameter} exactly, but this model fuses it into {slot.module} "
                         "(--fuse-qkv): load the model without --fuse-qkv to apply exact parts; nothing was applied.")
    target = parameter_of(transformer, parameter)
    if target is None:
        raise H3AppError(f"adapter {name!r} changes {parameter}, which this model does not have: it is for another "
                         "model; nothing was applied.")
    if tuple(target.shape) != tuple(shape):
        raise H3AppError(f"adapter {name!r}: its part for {parameter} is {list(shape)}, the model's is "
                         f"{list(target.shape)}: it is for another model; nothing was applied.")
    _check_writable(name, parameter, target)
    for other, other_replaces in taken.get(parameter, ()):
        if replaces or other_replaces:
            what = "two replacements of" if replaces and other_replaces else "a replacement beside another change of"
            raise H3AppError(f"adapter {name!r} and adapter {other!r} are {what} {parameter}: the last would discard "
                             "the other; attach one of them.")
    return target


def _place(plan: ExactPlan, parameter: str, entry: ExactEntry | BankHead, slots: Mapping[str, TargetSlot]) -> None:
    module, _, attr = parameter.rpartition(".")
    if attr == "weight" and module in slots:
        plan.linear.setdefault(slots[module].module, []).append(entry)
    else:
        plan.params.setdefault(parameter, []).append(entry)


def _bank_entries(name: str, module: str, bank: HeadBank, transformer: torch.nn.Module,
                  slots: Mapping[str, TargetSlot], taken: Mapping[str, Iterable[tuple[str, bool]]],
                  plan: ExactPlan) -> tuple[BankHead, BankHead | None]:
    weight = _check_part(name, f"{module}.weight", bank.weight.shape[1:], transformer, slots, taken, True)
    head = BankHead(name, f"{module}.weight", bank.weight.detach().to(device=weight.device, dtype=torch.float32))
    _place(plan, head.parameter, head, slots)
    bias_head = None
    if bank.bias is not None:
        bias = _check_part(name, f"{module}.bias", bank.bias.shape[1:], transformer, slots, taken, True)
        bias_head = BankHead(name, f"{module}.bias", bank.bias.detach().to(device=bias.device, dtype=torch.float32))
        _place(plan, bias_head.parameter, bias_head, slots)
    return head, bias_head
