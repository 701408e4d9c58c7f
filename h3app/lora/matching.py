"""Matching an adapter's targets to a transformer's slots, without binding anything: which modules fit, which keys
matched nothing, which model targets the adapter leaves alone, and each match's alpha and effective scale."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..adapters.types import ModuleLoRA, NormalisedAdapter
from ..rules.blocks import block_index
from ..settings import LoRASettings
from .report import Coverage, MatchReport, ShapeError, TargetMatch
from .rows import RowTags
from .scaling import AdapterScale, ModuleAlpha
from .targets import TargetSlot
from .validation import shape_problem


@dataclass
class MatchPlan:
    """A match before binding: the report (shape errors included, no profile) and the modules that fit."""

    report: MatchReport
    matched: dict[str, ModuleLoRA]


def adapter_scale(matched: Mapping[str, ModuleLoRA], settings: LoRASettings,
                  tags: RowTags | None = None) -> AdapterScale:
    """The scale state of the ``matched`` modules at ``settings`` (``tags``: the engine's token tags, which its
    per-modality factors read)."""
    return AdapterScale((ModuleAlpha.of(m) for m in matched.values()), settings.alpha, settings.strength,
                        settings.group_strengths, settings.blocks, settings.modality, tags)


def target_match(slot: TargetSlot, module: ModuleLoRA, state: AdapterScale) -> TargetMatch:
    """``module`` bound at ``slot``, with the alpha (and its source) and float64 effective scale ``state`` gives."""
    stored = ModuleAlpha.of(module)
    return TargetMatch(target=slot.target, module=slot.module, group=slot.group, rank=module.rank,
                       alpha=state.alpha_in_use(stored), alpha_source=state.alpha_source(module.alpha_source),
                       use_rslora=module.use_rslora,
                       effective_scale=state.scale(slot.group, stored, block_index(slot.target)))


def plan_match(adapter: NormalisedAdapter, slots: Mapping[str, TargetSlot], settings: LoRASettings, name: str, *,
               mode: str, fused_qkv: bool) -> MatchPlan:
    """Match every module of ``adapter`` against ``slots``: targets the model lacks are reported (their source keys
    as unmatched), factors that do not fit are shape errors, the rest match."""
    matched: dict[str, ModuleLoRA] = {}
    absent: list[str] = []
    absent_keys: list[str] = []
    errors: list[ShapeError] = []
    for target, module in adapter.modules.items():
        slot = slots.get(target)
        if slot is None:
            absent.append(target)
            absent_keys.extend(module.source_keys or (target,))
            continue
        problem = shape_problem(module, slot)
        if problem:
            errors.append(ShapeError(target, (slot.out_features, slot.in_features), tuple(module.down.shape),
                                     tuple(module.up.shape), problem))
            continue
        matched[target] = module
    state = adapter_scale(matched, settings)
    coverage = Coverage(
        unmatched_keys=tuple(dict.fromkeys((*adapter.unmatched_keys, *absent_keys))),
        absent_targets=tuple(absent),
        uncovered_targets=tuple(t for t in slots if t not in adapter.modules),
        shape_errors=tuple(errors),
    )
    matches = tuple(target_match(slots[target], module, state) for target, module in matched.items())
    report = MatchReport(name=name, identity=adapter.identity, mode=mode, fused_qkv=fused_qkv, matched=matches,
                         coverage=coverage)
    return MatchPlan(report, matched)
