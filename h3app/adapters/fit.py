"""Does an adapter fit a transformer? Every target's ``[out, in]`` against the model's Linear shapes.

With the model in use, a misfit is refused (``H3AppError`` listing the first few). Without one, the known
full-size H3 shapes are used to *warn* only: a file that fits the model in use is never refused for not fitting
the full-size model. The classic misfit is a LoRA trained on a *pruned* H3 checkpoint (its AdaLN projections are
sized differently) used on the full model; it is named as such.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import H3AppError
from ..rules.h3_modules import ADALN, FULL_SIZE_CONFIG, QKV, TransformerShapes, group_of, transformer_shapes
from .formats import ModulePlan

_SHOWN = 3
RANK_FLOOR = 512  # the rank limit is in + out, never below this (published H3 LoRAs use ranks 4-256)


def rank_limit(out_features: int, in_features: int) -> int:
    """The largest rank accepted for an ``[out, in]`` layer: ``in + out`` (no LoRA needs more: rank ``min(in, out)``
    already spans every update; a hostile file would make later steps cost ``O(rank²)``), at least ``RANK_FLOOR``
    so that small models accept the ranks published adapters use."""
    return max(out_features + in_features, RANK_FLOOR)


def check_ranks(modules: Sequence[ModulePlan], name: str) -> None:
    """Refuse, from the header's shapes alone (before any tensor is read), a module whose rank is over
    :func:`rank_limit` of its target."""
    for module in modules:
        for target, (out_features, in_features) in zip(module.targets, module.target_shapes):
            limit = rank_limit(out_features, in_features)
            if module.rank > limit:
                raise H3AppError(
                    f"adapter {name!r}: {target} has rank {module.rank:,}, above the limit {limit} for its "
                    f"[{out_features}, {in_features}] layer (in + out, at least {RANK_FLOOR}): the file is "
                    f"malformed; nothing was applied — use a LoRA with a sane rank.")


@dataclass(frozen=True)
class Misfit:
    """One target that does not fit: ``lora`` is the adapter's ``(out, in)``, ``model`` the model's (None: absent)."""

    target: str
    lora: tuple[int, int]
    model: tuple[int, int] | None

    def describe(self) -> str:
        lora = f"{self.lora[0]}×{self.lora[1]}"
        if self.model is None:
            return f"{self.target} ({lora}) is not in the model"
        return f"{self.target}: LoRA {lora} vs model {self.model[0]}×{self.model[1]}"


def misfits(modules: Sequence[ModulePlan], shapes: TransformerShapes) -> list[Misfit]:
    """Every target of ``modules`` whose ``(out_features, in_features)`` differs from ``shapes`` (or is absent)."""
    found: list[Misfit] = []
    linears = shapes.linears
    for module in modules:
        for target, (out_features, in_features) in zip(module.targets, module.target_shapes):
            linear = linears.get(target)
            if linear is None:
                found.append(Misfit(target, (out_features, in_features), None))
            elif linear.out_features != out_features or linear.in_features != in_features:
                found.append(Misfit(target, (out_features, in_features), (linear.out_features, linear.in_features)))
    return found


def check_fit(modules: Sequence[ModulePlan], shapes: TransformerShapes, name: str) -> None:
    """Raise ``H3AppError`` when any target does not fit ``shapes``; the message names the likely cause."""
    found = misfits(modules, shapes)
    if not found:
        return
    shown = "; ".join(m.describe() for m in found[:_SHOWN])
    more = f" (+{len(found) - _SHOWN} more)" if len(found) > _SHOWN else ""
    diagnosis = _diagnosis(modules, found, shapes)
    if diagnosis and not diagnosis.startswith(" — it looks"):
        diagnosis += f", the model in use has hidden size {shapes.hidden_size}"
    raise H3AppError(f"{name} does not fit the model in use{diagnosis}: {shown}{more}.")


def full_size_warnings(modules: Sequence[ModulePlan]) -> list[str]:
    """Without a model: warn when the file does not fit the full-size H3 (never a refusal)."""
    full = _full_size_shapes()
    found = misfits(modules, full)
    if not found:
        return []
    return [
        f"does not fit the full-size MiniMax-H3{_diagnosis(modules, found, full)} ({found[0].describe()}; "
        f"{len(found)} targets): fine if it is for a smaller model; check it with --model."
    ]


@functools.cache
def _full_size_shapes() -> TransformerShapes:
    return transformer_shapes(FULL_SIZE_CONFIG)


def _diagnosis(modules: Sequence[ModulePlan], found: Sequence[Misfit], shapes: TransformerShapes) -> str:
    hidden = {m.target_shapes[0][1] for m in modules if m.targets[0].endswith(tuple(f"attn.{q}" for q in QKV))}
    if shapes.is_full_size and found and all(group_of(m.target) == ADALN and m.model is not None for m in found):
        return " — it looks like a LoRA for a pruned H3 checkpoint (its AdaLN projections are sized differently); use the pruned model or a LoRA for the full one"
    if hidden and hidden != {shapes.hidden_size}:
        size = "the full-size H3" if hidden == {FULL_SIZE_CONFIG["hidden_size"]} else f"an H3 with hidden size {sorted(hidden)[0]}"
        return f" — it is a LoRA for {size}"
    return ""
