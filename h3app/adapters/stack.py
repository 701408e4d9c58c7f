"""Several adapters, each at its own alpha, strength and block strengths, as one adapter whose run at strength 1 is
the stack's run: per target the pairs concatenate (``A = [A₁; A₂; …]``, ``B = [s₁B₁, s₂B₂, …]``, scale 1), which is
exact; ``rank`` resizes each target by SVD, from the factors alone.

The SVD of ``ΔW = B A`` (``[out, in]``, never formed): with ``B = Q_B R_B`` and ``Aᵀ = Q_A R_A`` (thin QR),
``ΔW = Q_B (R_B R_Aᵀ) Q_Aᵀ`` and the small core's SVD ``U S Vᵀ`` gives ``ΔW``'s: ``(Q_B U) S (Q_A V)ᵀ``. Keeping the
``rank`` largest singular values is the best approximation of that rank (Eckart–Young); what it drops is stated:
the energy kept (``Σ kept S² / Σ S²`` over every target) and the largest per-target relative error
``‖ΔW − ΔW_r‖_F / ‖ΔW‖_F``. The scale per adapter is the one formula (``rules/scale.py``): the module's alpha (the
resolved chain, or the explicit one the adapter was loaded with), the strength, the main block's factor, / rank.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import H3AppError
from ..rules.alpha_source import AlphaSource
from ..rules.blocks import BlockStrength
from ..rules.scale import effective_scale
from .types import ModuleLoRA, NormalisedAdapter


@dataclass(frozen=True)
class StackPart:
    """One adapter of the stack: its normalised file (alpha already explicit where one was given), strength and
    block factors."""

    adapter: NormalisedAdapter
    strength: float
    blocks: BlockStrength
    name: str


@dataclass(frozen=True)
class Resize:
    """What ``rank`` kept: energy share over every target, the largest per-target relative Frobenius error and its
    target, how many targets were cut."""

    rank: int
    energy_kept: float
    max_relative_error: float
    worst_target: str | None
    cut_targets: int

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def check_parts(parts: Sequence[StackPart]) -> None:
    """One line for what a sum of A/B pairs cannot hold: exact parts, DoRA magnitudes."""
    for part in parts:
        if part.adapter.has_exact_parts:
            raise H3AppError(f"{part.name} carries exact parts (deltas, replacements or a head bank) that a PEFT LoRA "
                             "cannot hold: export the stack without it.")
        if part.adapter.has_magnitudes:
            raise H3AppError(f"{part.name} is a DoRA (its ΔW depends on the base weights and does not add to "
                             "others'): export it alone with --model, or leave it out of the stack.")


def stacked_modules(parts: Sequence[StackPart]) -> dict[str, ModuleLoRA]:
    """Target → one pair holding the sum of every part's scaled delta (float64), alpha = width (scale 1)."""
    check_parts(parts)
    pieces: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for part in parts:
        for target, module in part.adapter.modules.items():
            scale = effective_scale(module.alpha, part.strength, module.rank, module.use_rslora,
                                    block_strength=part.blocks.factor_of(target))
            pieces.setdefault(target, []).append((module.down.double(), scale * module.up.double()))
    modules = {}
    for target, pairs in pieces.items():
        down = torch.cat([d for d, _ in pairs], dim=0)
        up = torch.cat([u for _, u in pairs], dim=1)
        modules[target] = ModuleLoRA(target=target, down=down, up=up, alpha=float(down.shape[0]),
                                     alpha_source=AlphaSource.EXPLICIT)
    return modules


def resize(modules: dict[str, ModuleLoRA], rank: int) -> tuple[dict[str, ModuleLoRA], Resize]:
    """Each target at most ``rank`` wide by SVD of its factors (module docstring); the rest as they are."""
    if rank < 1:
        raise H3AppError(f"--rank must be at least 1, got {rank}.")
    out: dict[str, ModuleLoRA] = {}
    total = kept = 0.0
    worst, worst_target, cut = 0.0, None, 0
    for target, module in modules.items():
        q_b, r_b = torch.linalg.qr(module.up.double())
        q_a, r_a = torch.linalg.qr(module.down.double().T)
        u, s, vh = torch.linalg.svd(r_b @ r_a.T)
        energy = float((s**2).sum())
        keep = min(rank, int(s.shape[0]))
        total += energy
        kept += float((s[:keep] ** 2).sum())
        error = math.sqrt(max(energy - float((s[:keep] ** 2).sum()), 0.0) / energy) if energy > 0 else 0.0
        if error > worst:
            worst, worst_target = error, target
        cut += keep < module.width
        up = (q_b @ u[:, :keep]) * s[:keep]
        down = (q_a @ vh[:keep].T).T
        out[target] = dataclasses.replace(module, down=down, up=up, alpha=float(keep))
    return out, Resize(rank, kept / total if total > 0 else 1.0, worst, worst_target, cut)


def stack_adapter(parts: Sequence[StackPart], rank: int | None = None) -> tuple[NormalisedAdapter, Resize | None]:
    """The stack as one ``NormalisedAdapter`` (scale 1 per module at strength 1) for ``export.export_adapter``."""
    modules = stacked_modules(parts)
    report = None
    if rank is not None:
        modules, report = resize(modules, rank)
    first = parts[0].adapter
    identity = " + ".join(part.name for part in parts)
    return NormalisedAdapter(info=first.info, modules=modules, identity=identity), report
