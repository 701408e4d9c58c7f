"""How two adapters differ: per main block and module group, the norms of their effective deltas and the cosine
between them, from the factors alone (no base weight is read).

An adapter's effective delta on one Linear is ``ΔW = s · B A`` (``s``: the one scale formula, ``rules/scale.py``,
through ``lora.scaling.AdapterScale`` at the adapter's settings: resolved or explicit alpha, strength, group and
block strengths), plus ``strength · D`` for an exact ``.diff`` part on the weight. Norms and inner products come
from small products, never from ``ΔW`` itself (``[out, in]`` would be 5120 × 5120 per module on the full model):

- ``‖s B A‖²_F = s² · Σ (BᵀB ⊙ AAᵀ)`` — two ``r × r`` Gram matrices;
- ``⟨s₁ B₁A₁, s₂ B₂A₂⟩_F = s₁ s₂ · Σ (B₁ᵀB₂ ⊙ A₁A₂ᵀ)`` — two ``r₁ × r₂`` products;
- ``⟨s B A, t D⟩_F = s t · Σ ((Bᵀ D) ⊙ A)`` for an exact delta ``D``.

Sums of inner products over the modules of a (block, group) give that cell's cosine, over every module the
overall cosine. Everything is float64. Per-modality factors and a strength schedule act on rows and evaluations,
not on ``ΔW``: they are left at 1 (said in ``notes``). A DoRA module's delta depends on the base weight's row
norms, and a replacement or a head bank is no delta: those are refused or left out in one line each.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..adapters.types import NormalisedAdapter
from ..errors import H3AppError
from ..rules.blocks import block_index
from ..rules.h3_modules import group_of
from ..settings import LoRASettings
from .matching import adapter_scale
from .scaling import ModuleAlpha

Term = tuple[float, torch.Tensor, torch.Tensor | None]  # (scale, B or D, A; None for a full delta D)


@dataclass
class Cell:
    """Sums over the modules of one (block, group): ``‖ΔA‖²``, ``‖ΔB‖²``, ``⟨ΔA, ΔB⟩``."""

    aa: float = 0.0
    bb: float = 0.0
    ab: float = 0.0
    modules: int = 0

    def add(self, aa: float, bb: float, ab: float) -> None:
        self.aa, self.bb, self.ab, self.modules = self.aa + aa, self.bb + bb, self.ab + ab, self.modules + 1

    @property
    def cosine(self) -> float | None:
        """None where either delta is zero (no direction to compare)."""
        denominator = math.sqrt(self.aa) * math.sqrt(self.bb)
        return max(-1.0, min(1.0, self.ab / denominator)) if denominator > 0 else None


@dataclass
class AdapterDiff:
    """The comparison: one overall cell, one per (block, group) (block None: outside the main blocks)."""

    total: Cell = field(default_factory=Cell)
    cells: dict[tuple[int | None, str], Cell] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        def key(item: tuple[tuple[int | None, str], Cell]) -> tuple[int, str]:
            (block, group), _ = item
            return (-1 if block is None else block, group)

        blocks = [{"block": block, "group": group, "norm_a": math.sqrt(cell.aa), "norm_b": math.sqrt(cell.bb),
                   "cosine": cell.cosine, "modules": cell.modules}
                  for (block, group), cell in sorted(self.cells.items(), key=key)]
        return {"cosine": self.total.cosine, "norm_a": math.sqrt(self.total.aa), "norm_b": math.sqrt(self.total.bb),
                "modules": self.total.modules, "blocks": blocks, "notes": list(self.notes)}


def delta_terms(adapter: NormalisedAdapter, settings: LoRASettings) -> dict[str, list[Term]]:
    """Weight path → the terms of ``adapter``'s effective delta at ``settings`` (factors in float64)."""
    dora = [t for t, m in adapter.modules.items() if m.magnitude is not None]
    if dora:
        raise H3AppError(f"{dora[0]} is a DoRA module: its delta depends on the base weight's row norms, which diff "
                         "does not read; compare the adapters' A/B pairs with a LoRA or LoKr/LoHa file.")
    state = adapter_scale(adapter.modules, settings)
    terms: dict[str, list[Term]] = {}
    for target, module in adapter.modules.items():
        scale = state.scale(group_of(target), ModuleAlpha.of(module), block_index(target))
        terms.setdefault(f"{target}.weight", []).append((scale, module.up.double(), module.down.double()))
    for parameter, part in adapter.parts.items():
        if part.kind == "diff" and part.tensor.ndim == 2:
            # an exact delta follows the strength alone (``lora.exact.PartStrength``: no alpha, rank or block factor)
            terms.setdefault(parameter, []).append((settings.strength, part.tensor.double(), None))
    return terms


def left_out(adapter: NormalisedAdapter, name: str) -> Iterator[str]:
    """One note per kind of part that is not a weight delta (biases, replacements, head banks)."""
    kinds: dict[str, int] = {}
    for part in adapter.parts.values():
        if not (part.kind == "diff" and part.tensor.ndim == 2):
            kinds[part.kind] = kinds.get(part.kind, 0) + 1
    if adapter.banks:
        kinds["head bank"] = len(adapter.banks)
    for kind, count in sorted(kinds.items()):
        yield f"{name}: {count} {kind} part(s) left out (not a delta of a Linear's weight)"


def inner(x: Term, y: Term) -> float:
    """``⟨x, y⟩_F`` of two terms, from products no larger than rank × rank (or rank × in for a full delta)."""
    (sx, bx, ax), (sy, by, ay) = x, y
    if ax is not None and ay is not None:
        value = ((bx.T @ by) * (ax @ ay.T)).sum()
    elif ax is not None:
        value = ((bx.T @ by) * ax).sum()
    elif ay is not None:
        value = ((by.T @ bx) * ay).sum()
    else:
        value = (bx * by).sum()
    return sx * sy * float(value)


def module_sums(xs: list[Term], ys: list[Term]) -> tuple[float, float, float]:
    """``(‖Σxs‖², ‖Σys‖², ⟨Σxs, Σys⟩)`` of one weight."""
    aa = sum(inner(a, b) for a in xs for b in xs)
    bb = sum(inner(a, b) for a in ys for b in ys)
    ab = sum(inner(a, b) for a in xs for b in ys)
    return max(aa, 0.0), max(bb, 0.0), ab


def compare_adapters(a: NormalisedAdapter, settings_a: LoRASettings, b: NormalisedAdapter,
                     settings_b: LoRASettings) -> AdapterDiff:
    """Per (block, group) and overall: the two effective deltas' norms and cosine (module docstring)."""
    terms_a, terms_b = delta_terms(a, settings_a), delta_terms(b, settings_b)
    result = AdapterDiff()
    with torch.no_grad():
        for path in sorted(set(terms_a) | set(terms_b)):
            sums = module_sums(terms_a.get(path, []), terms_b.get(path, []))
            target = path.rsplit(".", 1)[0]
            result.cells.setdefault((block_index(target), group_of(target)), Cell()).add(*sums)
            result.total.add(*sums)
    result.notes.extend([*left_out(a, "A"), *left_out(b, "B")])
    if any((s.video_strength, s.text_strength, s.audio_strength) != (1.0, 1.0, 1.0) or s.strength_schedule
           for s in (settings_a, settings_b)):
        result.notes.append("per-modality factors and strength schedules act on rows and evaluations, not on ΔW: "
                            "compared at 1")
    return result

