"""Bind normalised adapters to a held H3 transformer: attach, change alpha/strength at run time, detach.

The engine composes the parts of ``h3app/lora``: where targets live (``targets``), matching an adapter to them
(``matching``), the checks run first (``validation``), the entries bound per module (``entries``), the bound layers
with their mode and transaction (``bound``), and the strength measurements (``measure``).

Transaction rule: every change validates first and touches nothing on failure; once binding starts, an exception
anywhere rolls every touched layer back to its previous state (``BoundLayers.transaction``), so the base weights are
bitwise what they were.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..adapters.types import ModuleLoRA, NormalisedAdapter
from ..errors import H3AppError
from ..rules.blocks import block_index
from ..rules.choices import LORA_MODES, MERGED
from ..rules.scale import DORA_STRENGTH_RULE
from ..settings import LoRASettings, merged_refusal
from .bound import BoundLayers
from .delegate import read_through
from .dora import refuse_dora_beside_parts
from .entries import build_entries, zero_entries
from .evaluations import StepListeners
from .exact import BankHead, ExactPlan, PartStrength, plan_exact
from .head_bank import BankListener
from .layers import LoRAFactors
from .matching import MatchPlan, adapter_scale, plan_match, target_match
from .measure import StrengthMeter
from .param_patches import ParamPatches
from .pristine import PristineStore
from .report import Coverage, MatchReport
from .rows import RowTags
from .scaling import AdapterScale, ModuleAlpha
from .step_strength import StepStrength
from .targets import TargetSlot, discover_targets
from .validation import (
    UNCHANGED,
    changed_settings,
    check_alpha_applies,
    check_dora_settings,
    check_groups,
    check_ranks,
    check_strength,
    modality_warning,
    refuse_unfit,
)


@dataclass
class _Attached:
    """One attached adapter: its settings and scale state, its entries by module path, its matched modules, and
    what its attach found (coverage, warnings)."""

    settings: LoRASettings
    state: AdapterScale
    entries: dict[str, LoRAFactors]
    adapter: NormalisedAdapter
    modules: dict[str, ModuleLoRA]
    coverage: Coverage
    warnings: tuple[str, ...] = ()
    exact: ExactPlan = field(default_factory=ExactPlan)  # exact parts and head banks (h3app.lora.exact)
    bank_listener: BankListener | None = None
    step_listener: StepStrength | None = None  # its strength schedule, per evaluation of a run

    @property
    def paths(self) -> list[str]:
        """Every module path this adapter binds: its LoRA entries' and its exact Linear weights'."""
        return sorted(set(self.entries) | set(self.exact.linear))


class LoRAEngine:
    """Adapters on one transformer. Not thread-safe: one worker thread owns it.

    Mode is engine-wide: ``unmerged`` (default; wrappers add ``scale·B·A·x`` at run time, slider changes are O(1))
    or ``merged`` (``W = W0 + Σ scale·B@A`` re-merged from a pristine copy on every change).
    """

    def __init__(self, transformer: nn.Module, *, pristine: PristineStore | None = None,
                 device: torch.device | str | None = None) -> None:
        """``pristine``: where merged mode keeps base copies (default: RAM, else disk). ``device``: where LoRA
        factors live (default: each bound weight's device; give the execution device when the transformer is
        offloaded, so that weights sit on the CPU between calls)."""
        self.transformer = transformer
        self._factor_device = torch.device(device) if device is not None else None
        self._slots = discover_targets(transformer)
        if not self._slots:
            raise H3AppError("the transformer has no Linear layers to attach LoRA to: is it an H3 transformer?")
        self._layers = BoundLayers(transformer, pristine if pristine is not None else PristineStore())
        self._params = ParamPatches(transformer, self._layers.pristine)  # biases and norm weights of exact parts
        self._adapters: dict[str, _Attached] = {}
        self._meter = StrengthMeter(self._slots, self._layers, self._device_of)
        self._tags = RowTags()  # the token tags per-modality factors read (listening while any adapter has some)
        # Each adapter's per-evaluation listeners (its schedule, a head bank's), by name, on the transformer they serve
        self.step_listeners = StepListeners.on(transformer)
        self.num_blocks = 1 + max((i for i in map(block_index, self._slots) if i is not None), default=-1)
        # Under --compile, a grid over adapters of several ranks pads every A/B pair attached meanwhile to this
        # width with zeros (exact: zero rows of A, zero columns of B), so every row runs the same graphs.
        self.factor_rank: int | None = None
        self.factor_paths: frozenset[str] = frozenset()  # and every such adapter has an entry on these modules

    # ----------------------------------------------------------------------------------------------- queries
    def module_paths(self, targets: Iterable[str]) -> set[str]:
        """The module paths (a fused ``to_qkv`` once) that canonical ``targets`` bind to on this transformer."""
        return {self._slots[t].module for t in targets if t in self._slots}

    mode = read_through("_layers", "mode", "``unmerged`` or ``merged``, for every attached adapter.")
    pristine = read_through("_layers", "pristine", "Merged mode's base copies (set ``pristine.device_budget`` to "
                            "bound the accelerator memory they take).")
    factor_bytes = read_through("_layers", "factor_bytes", "Bytes of every attached adapter's factors as the engine "
                                "keeps them (on the device, in ``delta_dtype``); a factor shared by several targets "
                                "counts once.")

    @property
    def fused_qkv(self) -> bool:
        return any(slot.groups == 3 for slot in self._slots.values())

    @property
    def targets(self) -> Mapping[str, TargetSlot]:
        return dict(self._slots)

    def active(self) -> dict[str, LoRASettings]:
        """The settings each attached adapter runs at now (``mode`` is the engine's)."""
        return {name: dataclasses.replace(a.settings, mode=self.mode) for name, a in self._adapters.items()}

    def adapter(self, name: str) -> NormalisedAdapter:
        """The normalised adapter attached under ``name``."""
        return self._get(name).adapter

    def effective_scales(self, name: str) -> dict[str, float]:
        """Canonical target → float64 effective scale now in use."""
        attached = self._get(name)
        return {t: attached.state.scale(self._slots[t].group, ModuleAlpha.of(m), block_index(t))
                for t, m in attached.modules.items()}

    def report(self, name: str) -> MatchReport:
        """The match report of an attached adapter at its current settings, its strength profile computed now (the
        norms it needs are measured on the first request and memoised per adapter)."""
        report = self._build_report(name, self._get(name))
        report.profile  # noqa: B018 - measured here, on the thread that owns the engine
        return report

    def match(self, adapter: NormalisedAdapter, settings: LoRASettings | None = None, name: str = "adapter") -> MatchReport:
        """Validate ``adapter`` against this transformer without binding anything (shape errors included, no
        profile)."""
        settings = settings or LoRASettings(source=adapter.identity or name)
        return self._plan(adapter, settings, name).report

    # ------------------------------------------------------------------------------------------------ attach
    def attach(self, adapter: NormalisedAdapter, settings: LoRASettings, name: str) -> MatchReport:
        """Bind ``adapter`` under ``name`` at ``settings`` (alpha, strength, group strengths, mode).

        Raises ``MatchError`` (an ``H3AppError`` carrying the report) when any target has a shape error or nothing
        matched; then nothing is applied. Mode is engine-wide: attaching with another mode than the engine's
        switches every adapter to it.
        """
        if name in self._adapters:
            raise H3AppError(f"an adapter named {name!r} is already attached: detach it first, or change it with set_lora.")
        check_groups(settings.group_strengths)
        settings.blocks.check_blocks(self.num_blocks)
        plan = self._plan(adapter, settings, name)
        refuse_unfit(name, plan.report, has_parts=adapter.has_exact_parts)
        check_ranks(name, plan.matched, self._slots)
        check_alpha_applies(name, plan.matched, settings.alpha)
        check_dora_settings(name, plan.matched, settings)
        mode = self._engine_mode(settings)
        refusal = merged_refusal(settings.modality, settings.schedule) if mode == MERGED else None
        if refusal:
            raise H3AppError(refusal)
        taken = self._taken()
        exact = plan_exact(name, adapter, self.transformer, self._slots, PartStrength(settings.strength), taken)
        _refuse_replaced(name, plan.matched, taken)
        refuse_dora_beside_parts(name, self._dora_paths(plan.matched), exact.linear,
                                 [p for a in self._adapters.values() for p in self._dora_paths(a.modules)],
                                 [p for a in self._adapters.values() for p in a.exact.linear])
        lora_paths = sorted({self._slots[t].module for t in plan.matched})
        if mode == MERGED:
            self._layers.check_mergeable(lora_paths)
        state = adapter_scale(plan.matched, settings, self._tags)
        state.own_entries = self.factor_rank is not None  # a padded grid: no row aliases scale tensors
        entries = build_entries(name, plan.matched, self._slots, state, device_of=self._device_of,
                                dtype_of=lambda path: self._layers.weight(path).dtype, base_of=self._base_of,
                                pad_to=self.factor_rank)
        if self.factor_rank is not None and self.factor_paths:
            entries.update(zero_entries(name, self.factor_paths - set(entries), self._slots, state, self.factor_rank,
                                        device_of=self._device_of, dtype_of=lambda p: self._layers.weight(p).dtype))
        attached = _Attached(settings=settings, state=state, entries=entries, adapter=adapter,
                             modules=dict(plan.matched), coverage=plan.report.coverage,
                             warnings=self._warnings(adapter, plan.matched, settings, plan.report), exact=exact)

        def change() -> None:
            for path, entry in entries.items():
                self._layers.binding(path).wrapper.add_entry(entry)
            for path, items in exact.linear.items():
                self._layers.binding(path).wrapper.exact_entries.extend(items)

        self._layers.transaction(attached.paths, change, mode=mode, exact_paths=exact.linear)

        def add_params() -> None:
            for parameter, items in exact.params.items():
                for entry in items:
                    self._params.add(parameter, entry)

        try:
            self._params.transaction(exact.params, add_params)
        except BaseException:
            self._unbind([name], {name: attached})
            raise
        self._adapters[name] = attached
        if exact.banks:
            attached.bank_listener = BankListener(name, exact.banks, self._write_heads)
            self.step_listeners.add(_listener_name(name, BANK), attached.bank_listener)
        parts = (exact.strength, functools.partial(self._rewrite_parts, attached)) if exact.has_deltas else ()
        attached.step_listener = StepStrength(name, state, settings.schedule, *parts)
        self.step_listeners.add(_listener_name(name, SCHEDULE), attached.step_listener)
        self._listen_to_tags()
        if settings.mode != self.mode:
            try:
                self.set_mode(settings.mode)
            except BaseException:
                self.detach(name)
                raise
        return self._build_report(name, attached)

    # ------------------------------------------------------------------------------------------- set / mode
    def set_lora(self, name: str, *, alpha: float | None = UNCHANGED, strength: float = UNCHANGED,
                 group_strengths: Mapping[str, float] = UNCHANGED, exact_strength: float | None = UNCHANGED,
                 advanced: LoRASettings = UNCHANGED) -> LoRASettings:
        """Change an attached adapter's alpha (None = each module's stored alpha), strength and/or group strengths
        without reading its file again; an argument left out (``UNCHANGED``) keeps its value. O(1) in unmerged
        mode for the low-rank parts; merged mode re-merges its layers from the pristine copies. Exact deltas run at
        the strength (alpha does not apply to them) unless ``exact_strength`` pins them (None: follow the strength);
        when their strength changes, their parameters are rewritten from the pristine copies. ``advanced``: settings
        whose per-modality strengths, strength schedule and block strengths replace the adapter's (refused in
        merged mode unless they are 1 and no schedule). Returns the new settings."""
        attached = self._get(name)
        old = dataclasses.replace(attached.settings, mode=self.mode)  # the engine's mode is the one in force
        new = changed_settings(old, alpha, strength, group_strengths, advanced)
        check_alpha_applies(name, attached.modules, new.alpha)
        check_dora_settings(name, attached.modules, new)
        new.blocks.check_blocks(self.num_blocks)
        refusal = merged_refusal(new.modality, new.schedule) if self.mode == MERGED else None
        if refusal:
            raise H3AppError(refusal)
        parts = attached.exact.strength or PartStrength(old.strength)
        old_parts = (parts.strength, parts.pinned)
        pinned = parts.pinned if exact_strength is UNCHANGED else (
            None if exact_strength is None else check_strength(exact_strength, "exact-part strength"))
        deltas_move = attached.exact.has_deltas and PartStrength(new.strength, pinned).value != parts.value

        def change() -> None:
            attached.state.update(new.alpha, new.strength, new.group_strengths, new.blocks, new.modality)
            parts.strength, parts.pinned = new.strength, pinned

        def undo() -> None:
            attached.state.update(old.alpha, old.strength, old.group_strengths, old.blocks, old.modality)
            parts.strength, parts.pinned = old_parts

        paths = (list(attached.entries) if self.mode == MERGED else []) + (
            list(attached.exact.linear) if deltas_move else [])
        if not paths and not deltas_move:
            change()
        else:
            self._layers.transaction(sorted(set(paths)), change, undo=undo, mode=self.mode)
            try:
                if deltas_move:
                    self._params.transaction(attached.exact.params, lambda: None)
            except BaseException:
                self._layers.transaction(sorted(set(paths)), undo, mode=self.mode)  # strengths back, weights too
                for parameter in attached.exact.params:
                    self._params.write(parameter)
                raise
        attached.settings = new
        if attached.step_listener is not None:
            attached.step_listener.schedule = new.schedule  # parsed here, once per change, never per run
        self._listen_to_tags()
        return new

    def set_mode(self, mode: str) -> None:
        """Switch every attached adapter to ``unmerged`` or ``merged`` (refused with the reason when the base
        cannot be merged or no room is left for its pristine copy)."""
        if mode not in LORA_MODES:
            raise H3AppError(f"mode must be one of {', '.join(LORA_MODES)}, got {mode!r}.")
        if mode == self.mode:
            return
        paths = list(self._layers.paths)
        if mode == MERGED:
            for name, attached in self._adapters.items():
                refusal = merged_refusal(attached.settings.modality, attached.settings.schedule)
                if refusal:
                    raise H3AppError(f"adapter {name!r}: {refusal}")
            self._layers.check_mergeable(paths)
        self._layers.transaction(paths, lambda: None, mode=mode)

    # ------------------------------------------------------------------------------------------------ detach
    def detach(self, name: str | None = None) -> None:
        """Remove one adapter (or all with None). Layers left without adapters get their original module back,
        with weights bitwise equal to the base."""
        names = list(self._adapters) if name is None else [name]
        for each in names:
            self._get(each)
        self._unbind(names, self._adapters)
        for each in names:
            self._adapters.pop(each)
            for kind in (BANK, SCHEDULE):
                self.step_listeners.remove(_listener_name(each, kind))
        self._listen_to_tags()

    def _unbind(self, names: list[str], attached: Mapping[str, _Attached]) -> None:
        """Take ``names``' entries off their layers and parameters (weights back to the base where nothing else
        is bound)."""
        paths = sorted({path for each in names for path in attached[each].paths})
        params = sorted({param for each in names for param in attached[each].exact.params})

        def change() -> None:
            for each in names:
                for path in attached[each].paths:
                    self._layers.binding(path).wrapper.remove_adapter(each)

        self._layers.transaction(paths, change, mode=self.mode)

        def remove_params() -> None:
            for each in names:
                self._params.remove_adapter(each, params)

        self._params.transaction(params, remove_params)

    # ----------------------------------------------------------------------------------------------- helpers
    def _get(self, name: str) -> _Attached:
        try:
            return self._adapters[name]
        except KeyError:
            attached = ", ".join(self._adapters) or "none"
            raise H3AppError(f"no adapter named {name!r} is attached (attached: {attached}).") from None

    def _taken(self) -> dict[str, list[tuple[str, bool]]]:
        """Parameter → ``(adapter, replaces)`` of every attached adapter that changes it (pairs change weights)."""
        taken: dict[str, list[tuple[str, bool]]] = {}
        for name, attached in self._adapters.items():
            for target in attached.modules:
                taken.setdefault(f"{target}.weight", []).append((name, False))
            for entries in (*attached.exact.linear.values(), *attached.exact.params.values()):
                for entry in entries:
                    taken.setdefault(entry.parameter, []).append((name, entry.replaces))
        return taken

    def _listen_to_tags(self) -> None:
        """Read each forward's token tags while any adapter has per-modality factors (else no hook at all)."""
        if any(not a.settings.modality.is_unit for a in self._adapters.values()):
            self._tags.listen(self.transformer)
        else:
            self._tags.stop()

    def _rewrite_parts(self, attached: _Attached) -> None:
        """Write an adapter's exact deltas again at their strength now (a schedule's factor moved)."""
        self._layers.rewrite(sorted(attached.exact.linear))
        for parameter in attached.exact.params:
            self._params.write(parameter)

    def _write_heads(self, heads: list[BankHead]) -> None:
        """Write a head bank's current heads into their parameters (each evaluation of a run, and after it)."""
        paths = []
        for head in heads:
            module, _, attr = head.parameter.rpartition(".")
            if attr == "weight" and module in self._slots:
                paths.append(self._slots[module].module)
            else:
                self._params.write(head.parameter)
        self._layers.rewrite(paths)

    def _engine_mode(self, settings: LoRASettings) -> str:
        """The mode the engine runs in: its own while adapters are attached, else the settings'."""
        return self.mode if self._adapters else settings.mode

    def _dora_paths(self, modules: Mapping[str, ModuleLoRA]) -> list[str]:
        return [self._slots[t].module for t, m in modules.items() if m.magnitude is not None and t in self._slots]

    def _base_of(self, path: str) -> tuple[Callable[[int, int], torch.Tensor], torch.Tensor | None]:
        """The base weight's rows reader (the pristine copy while merged) and the bias of the Linear at ``path``."""
        module = self.transformer.get_submodule(path)
        return (lambda start, stop: self._layers.base_rows(path, start, stop)), getattr(module, "bias", None)

    def _device_of(self, path: str) -> torch.device:
        """Where the factors bound to ``path`` live."""
        return self._factor_device or self._layers.weight(path).device

    def _plan(self, adapter: NormalisedAdapter, settings: LoRASettings, name: str) -> MatchPlan:
        return plan_match(adapter, self._slots, settings, name, mode=self._engine_mode(settings),
                          fused_qkv=self.fused_qkv)

    def _warnings(self, adapter: NormalisedAdapter, matched: Mapping[str, ModuleLoRA], settings: LoRASettings,
                  report: MatchReport) -> tuple[str, ...]:
        """Keys that matched nothing; and, when no alpha is stored or given, an alpha far off the usual range (the
        only part of attach that measures norms, and only those of the rank-fallback targets)."""
        fallback = self._meter.fallback_warning(adapter, matched) if settings.alpha is None else None
        dora = DORA_STRENGTH_RULE if adapter.has_magnitudes else None
        return tuple(w for w in (report.coverage.unmatched_warning(), fallback, dora) if w is not None)

    def _build_report(self, name: str, attached: _Attached) -> MatchReport:
        """The report at the current settings; its profile is measured on first access."""
        matches = tuple(target_match(self._slots[t], m, attached.state) for t, m in attached.modules.items())
        exact = tuple(sorted(entry.parameter for entries in (*attached.exact.linear.values(),
                                                            *attached.exact.params.values()) for entry in entries
                             if not isinstance(entry, BankHead)))
        modality = modality_warning(attached.settings, attached.modules, attached.adapter.info.parts)
        return MatchReport(
            name=name, identity=attached.adapter.identity, mode=self.mode, fused_qkv=self.fused_qkv, matched=matches,
            coverage=attached.coverage, warnings=attached.warnings + ((modality,) if modality else ()),
            measure=lambda: self._meter.profile(attached.adapter, attached.modules, matches),
            exact_parameters=exact, head_banks=tuple(attached.exact.banks))


def _refuse_replaced(name: str, matched: Mapping[str, ModuleLoRA], taken: Mapping[str, list[tuple[str, bool]]]) -> None:
    """A pair on a weight another adapter replaces would be discarded by the replacement: refused."""
    for target in matched:
        for other, replaces in taken.get(f"{target}.weight", ()):
            if replaces:
                raise H3AppError(f"adapter {name!r} changes {target}.weight, which adapter {other!r} replaces: the "
                                 "replacement would discard it; attach one of them.")


BANK, SCHEDULE = "head-bank", "schedule"  # the kinds of step listener an adapter may register


def _listener_name(adapter: str, kind: str) -> str:
    """The name an adapter's step listener of ``kind`` is registered under on the transformer."""
    return f"{adapter}/{kind}"
