"""Strength-profile rescaling: pure arithmetic on what Load returned.

No model call: a module's relative update ``‖scale·B·A‖_F / ‖W‖_F`` is
``|scale| × ‖B·A‖_F / ‖W‖_F`` — linear in its scale — so the profile measured at Load is redrawn for any
alpha/strength from the per-target norms it carries, each times the effective scale of the resolved adapter
(``h3app.adapters.resolved``, the readout's and every job's) at that alpha/strength.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..adapters.resolved import resolve_adapter
from ..rules.alpha_source import AlphaSource
from ..rules.blocks import parse_block_strength
from ..rules.h3_modules import group_of
from ..rules.scale import scale_divisor
from ..rules.strength import USUAL_RELATIVE_UPDATE, suggest_alpha

RESOLVE_FACTS = ("ranks", "alphas", "alpha_sources", "use_rslora", "known")  # what resolve_adapter reads of an info


# ------------------------------------------------------------------------------------------------ strength profile
def profile_basis(report: Any, info: Mapping[str, Any], group_strengths: Mapping[str, float] | None = None
                  ) -> dict[str, Any] | None:
    """What the profile needs to be redrawn for any alpha/strength, from a Load's ``MatchReport`` and the adapter's
    ``AdapterInfo.to_json()``: per target its block, group, rank, chain alpha source and norms, and the facts the
    resolved adapter is computed from. None when the report has no profile (meta device)."""
    if report.profile is None:
        return None
    matched = {m.target: m for m in report.matched}
    sources = info.get("alpha_sources") or {}
    targets = {}
    for strength in report.profile.targets:
        match = matched.get(strength.target)
        if match is None:
            continue
        targets[strength.target] = {
            "block": strength.block,
            "group": strength.group,
            "rank": match.rank,
            "use_rslora": match.use_rslora,
            "chain_source": sources.get(strength.target, match.alpha_source),
            "update_norm": strength.update_norm,
            "weight_norm": strength.weight_norm,
        }
    return {"targets": targets, "adapter": {key: info[key] for key in RESOLVE_FACTS if key in info},
            "group_strengths": dict(group_strengths or {}), "usual_range": list(USUAL_RELATIVE_UPDATE)}


def relative_updates(basis: Mapping[str, Any], alpha: float | None, strength: float,
                     block_strength: Any = "") -> dict[str, float]:
    """target → ‖ΔW‖_F/‖W‖_F at ``alpha`` (None: chain value), ``strength`` and ``block_strength``
    (``rules.blocks``): the measured ‖B·A‖_F/‖W‖_F times the resolved adapter's effective scale of that target
    times its block's factor (the engine's formula, ``rules.scale``)."""
    scales = resolve_adapter(basis["adapter"], alpha, strength, basis.get("group_strengths")).scales
    factor = parse_block_strength(block_strength or "").factor_of
    return {target: abs(scales[target] * factor(target)) * t["update_norm"] / t["weight_norm"]
            if t["weight_norm"] > 0 else math.inf for target, t in basis["targets"].items()}


@dataclass(frozen=True)
class ProfileView:
    """Median relative update per group and per block (rows for bar plots), the overall median, and the warning
    for an implausible alpha (None when there is nothing to warn about)."""

    by_group: list[dict[str, Any]]
    by_block: list[dict[str, Any]]
    median: float
    warning: str | None


def profile_view(basis: Mapping[str, Any], alpha: float | None, strength: float,
                 block_strength: Any = "") -> ProfileView:
    """The profile at ``alpha``/``strength``; the warning follows the engine's rule (alpha not stored anywhere,
    on auto, median far above the usual range) through :func:`h3app.rules.strength.suggest_alpha`."""
    updates = relative_updates(basis, alpha, strength, block_strength)
    targets = basis["targets"]
    groups: dict[str, list[float]] = {}
    blocks: dict[str, list[float]] = {}
    for target, value in updates.items():
        groups.setdefault(targets[target]["group"], []).append(value)
        blocks.setdefault(targets[target]["block"], []).append(value)
    by_group = [{"group": group.replace("_", "-"), "relative update": statistics.median(values),
                 "targets": len(values)} for group, values in groups.items()]
    by_block = [{"block": short_block(block), "relative update": statistics.median(values), "targets": len(values)}
                for block, values in sorted(blocks.items(), key=lambda kv: _block_order(kv[0]))]
    median = statistics.median(updates.values()) if updates else 0.0
    warning = None
    fallback = {t: v for t, v in targets.items() if v["chain_source"] == AlphaSource.RANK_FALLBACK}
    if alpha is None and fallback:
        suggestion = suggest_alpha(
            {t: v["update_norm"] for t, v in fallback.items()}, {t: v["weight_norm"] for t, v in fallback.items()},
            {t: v["rank"] for t, v in fallback.items()},
            {t: scale_divisor(v["rank"], v["use_rslora"]) for t, v in fallback.items()}, strength=strength)
        if suggestion is not None:
            warning = suggestion.message()
    return ProfileView(by_group, by_block, median, warning)


def short_block(block: str) -> str:
    """``transformer_blocks.12`` → ``block 12``; ``token_refiner.refiner_blocks.1`` → ``refiner 1``."""
    if block.startswith("transformer_blocks."):
        return "block " + block.rsplit(".", 1)[1]
    if block.startswith("token_refiner."):
        return "refiner " + block.rsplit(".", 1)[1]
    return block


def _block_order(block: str) -> tuple[int, int]:
    if block.startswith("token_refiner."):
        return (0, int(block.rsplit(".", 1)[1]))
    if block.startswith("transformer_blocks."):
        return (1, int(block.rsplit(".", 1)[1]))
    return (2, 0)


def targets_by_group(targets: list[str]) -> dict[str, list[str]]:
    """Canonical targets grouped as in ``h3app.rules.h3_modules`` (attention, feed-forward, AdaLN, refiner, I/O)."""
    grouped: dict[str, list[str]] = {}
    for target in targets:
        grouped.setdefault(group_of(target), []).append(target)
    return grouped
