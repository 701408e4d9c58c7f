"""Measuring an attached adapter on the held model: its strength profile, and the rank-fallback alpha warning.

``‖B·A‖_F`` is measured on the factors' device on the first request and memoised per adapter, ``‖W‖_F`` once per
model target (``NormMemo``). Tensors with a shape but no values (the meta device, or shape-only stand-ins such as a
rehearsal's) are never measured: their profile is None and no warning is decided from them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ..adapters.types import ModuleLoRA
from ..rules.alpha_source import AlphaSource
from ..rules.scale import scale_divisor
from .bound import BoundLayers
from .layers import has_values
from .profile import NormMemo, StrengthProfile, TargetStrength, block_of, build_profile, suggest_alpha
from .report import TargetMatch
from .targets import TargetSlot


class StrengthMeter:
    """Norms of one engine's adapters and base weights (``slots``: the engine's targets; ``factor_device``: where
    factors live when not beside their weight)."""

    def __init__(self, slots: Mapping[str, TargetSlot], layers: BoundLayers,
                 factor_device: Callable[[str], torch.device]) -> None:
        self._slots = slots
        self._layers = layers
        self._factor_device = factor_device
        self._norms = NormMemo()

    def fallback_warning(self, adapter: Any, matched: Mapping[str, ModuleLoRA]) -> str | None:
        """When the rank-fallback modules of ``matched`` (no alpha stored) update their layers far more than usual
        at alpha = rank, the warning naming a plausible alpha; else None. Measures those modules' norms only."""
        fallback = {t: m for t, m in matched.items() if m.alpha_source == AlphaSource.RANK_FALLBACK}
        if not fallback or not self._measurable(fallback):
            return None
        updates = self._norms.update_norms(adapter, fallback, self._norm_device)
        suggestion = suggest_alpha(
            updates, self._norms.weight_norms(fallback, self._base_rows), {t: m.rank for t, m in fallback.items()},
            {t: scale_divisor(m.rank, m.use_rslora) for t, m in fallback.items()})
        return suggestion.message() if suggestion is not None else None

    def profile(self, adapter: Any, modules: Mapping[str, ModuleLoRA],
                matches: Iterable[TargetMatch]) -> StrengthProfile | None:
        """The strength profile of ``matches`` (``modules``: their factors), None when nothing can be measured."""
        if not self._measurable(modules):
            return None
        updates = self._norms.update_norms(adapter, modules, self._norm_device)
        weights = self._norms.weight_norms(modules, self._base_rows)
        return build_profile(TargetStrength(m.target, block_of(m.target), m.group, m.effective_scale,
                                            updates[m.target], weights[m.target]) for m in matches)

    def _measurable(self, modules: Mapping[str, ModuleLoRA]) -> bool:
        return all(has_values(m.down) and has_values(m.up) and has_values(self._layers.weight(self._slots[t].module))
                   for t, m in modules.items())

    def _norm_device(self, target: str) -> torch.device:
        return self._factor_device(self._slots[target].module)

    def _base_rows(self, target: str) -> torch.Tensor:
        """The base weight rows of ``target`` (from the pristine copy while merged weights are in place)."""
        slot = self._slots[target]
        return self._layers.base_rows(slot.module, *slot.row_span)
