"""The engine's checks, run before anything is touched: factor shapes, ranks, group names, the refusal of an adapter
that does not fit, and new settings for ``set_lora``. Each raises (or reports) and changes nothing."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from ..adapters.fit import RANK_FLOOR, rank_limit
from ..adapters.parts import HEAD_BANK, PART_KINDS
from ..adapters.types import ModuleLoRA
from ..errors import H3AppError
from ..rules.h3_modules import GROUPS
from ..rules.modality import SHARED, rows_of
from ..settings import ADVANCED_FIELDS, LoRASettings, check_alpha, check_strength
from .report import MatchError, MatchReport
from .targets import TargetSlot


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Any = _Unchanged()


def shape_problem(module: ModuleLoRA, slot: TargetSlot) -> str | None:
    """Why ``module``'s factors (``A [r, in]``, ``B [out, r]``) and alpha do not fit ``slot``; None when they do."""
    down, up = module.down, module.up
    if down.ndim != 2 or up.ndim != 2:
        return f"factors must be 2D, got A with {down.ndim} dims and B with {up.ndim} dims"
    if not (down.dtype.is_floating_point and up.dtype.is_floating_point):
        return f"factors must be floating point, got {down.dtype} and {up.dtype}"
    if down.shape[0] < 1:
        return "rank is 0"
    if down.shape[0] != up.shape[1]:
        return f"rank mismatch: A has rank {down.shape[0]} but B has rank {up.shape[1]}"
    if down.shape[1] != slot.in_features:
        return f"A has in_features {down.shape[1]}, the model's layer has {slot.in_features}"
    if up.shape[0] != slot.out_features:
        return f"B has out_features {up.shape[0]}, the model's layer has {slot.out_features}"
    alpha = module.alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        return f"alpha {alpha!r} is not a finite number > 0"
    return None


def refuse_unfit(name: str, report: MatchReport, has_parts: bool = False) -> None:
    """Raise ``MatchError`` (carrying ``report``) when any target has a shape error or nothing matched (an adapter
    with exact parts may have no pair at all: ``has_parts``)."""
    errors = report.shape_errors
    if errors:
        first = "; ".join(e.describe() for e in errors[:3])
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        raise MatchError(
            f"adapter {name!r} does not fit this model: {len(errors)} shape errors: {first}{more}; "
            f"nothing was applied — is it for another model (e.g. a pruned H3)?", report)
    if not report.matched and not has_parts:
        sample = ", ".join(list(report.unmatched_keys)[:3]) or "none"
        raise MatchError(
            f"adapter {name!r} matched no layer of this model ({len(report.unmatched_keys)} keys unmatched, "
            f"e.g. {sample}): check that it is an H3 LoRA for this partition.", report)


def check_ranks(name: str, matched: Mapping[str, ModuleLoRA], slots: Mapping[str, TargetSlot]) -> None:
    """Refuse a rank above ``in + out`` (no LoRA needs one: rank ``min(in, out)`` already spans every update; a
    hostile file would make later steps cost ``O(rank²)``). Ranks up to ``RANK_FLOOR`` always pass, so that small
    models accept the ranks published adapters use."""
    for target, module in matched.items():
        slot = slots[target]
        limit = rank_limit(slot.out_features, slot.in_features)
        if module.width > limit:
            raise H3AppError(
                f"adapter {name!r}: {target} has rank {module.width}, above the limit {limit} for its "
                f"[{slot.out_features}, {slot.in_features}] layer (in + out, at least {RANK_FLOOR}): the file is "
                f"malformed; nothing was applied — use a LoRA with a sane rank.")


def check_groups(group_strengths: Mapping[str, float]) -> None:
    unknown = [group for group in group_strengths if group not in GROUPS]
    if unknown:
        raise H3AppError(f"unknown group {unknown[0]!r} in group strengths: use {', '.join(GROUPS)}.")


def check_alpha_applies(name: str, modules: Mapping[str, ModuleLoRA], alpha: float | None) -> None:
    """Refuse an explicit alpha for an adapter with modules whose kind ignores alpha (a LoKr with both Kronecker
    factors whole runs at scale 1 × strength in LyCORIS and ComfyUI): alpha × strength would not be its scale."""
    fixed = sorted(t for t, m in modules.items() if not m.alpha_applies)
    if alpha is not None and fixed:
        raise H3AppError(f"adapter {name!r}: alpha does not apply to {len(fixed)} of its LoKr targets (e.g. {fixed[0]}: "
                         "both Kronecker factors stored whole, which LyCORIS and ComfyUI run at scale 1 × strength), "
                         "so alpha × strength is not its scale; leave alpha on auto and set the strength.")


def check_dora_settings(name: str, modules: Mapping[str, ModuleLoRA], settings: LoRASettings) -> None:
    """Refuse per-modality strength for a DoRA adapter: its row norm is of the whole weight at one scale, so a
    factor per token row has no DoRA meaning (PEFT has none)."""
    if not settings.modality.is_unit and any(m.magnitude is not None for m in modules.values()):
        raise H3AppError(f"adapter {name!r} is a DoRA: its magnitude normalises whole weight rows at one scale, so "
                         f"per-modality strength ({settings.modality.label}) cannot apply; set every modality to 1.")


def changed_settings(old: LoRASettings, alpha: Any, strength: Any, group_strengths: Any,
                     advanced: Any = UNCHANGED) -> LoRASettings:
    """``old`` with each argument that is not ``UNCHANGED`` checked and put in its place (``alpha=None``: each
    module's stored alpha; ``advanced``: settings whose per-modality, schedule and block strengths replace old's)."""
    if advanced is not UNCHANGED:
        old = dataclasses.replace(old, **{name: getattr(advanced, name) for name in ADVANCED_FIELDS})
    new_alpha = old.alpha if alpha is UNCHANGED else check_alpha(alpha)
    new_strength = old.strength if strength is UNCHANGED else check_strength(strength)
    new_groups = dict(old.group_strengths) if group_strengths is UNCHANGED else dict(group_strengths)
    check_groups(new_groups)
    for group, value in new_groups.items():
        check_strength(value, what=f"strength of group {group!r}")
    return dataclasses.replace(old, alpha=new_alpha, strength=new_strength, group_strengths=new_groups)


def modality_warning(settings: LoRASettings, modules: Mapping[str, ModuleLoRA],
                     parts: Mapping[str, int]) -> str | None:
    """What per-modality strength cannot reach, in one line (None when every factor is 1 or it reaches everything):
    pairs on timestep rows every modality reads, and exact parts (written into the weights for every row)."""
    if settings.modality.is_unit:
        return None
    shared = sorted(t for t in modules if rows_of(t) == SHARED)
    exact = sum(parts.get(kind, 0) for kind in PART_KINDS) + (1 if parts.get(HEAD_BANK) else 0)
    if not shared and not exact:
        return None
    reach = []
    if shared:
        reach.append(f"{len(shared)} targets every modality reads ({', '.join(shared[:2])}{', …' if len(shared) > 2 else ''})")
    if exact:
        reach.append(f"its {exact} exact parts or head bank (written into the weights of every row)")
    return (f"per-modality strength ({settings.modality.label}) does not reach {' nor '.join(reach)}: they run at the "
            f"adapter's strength for every modality.")
