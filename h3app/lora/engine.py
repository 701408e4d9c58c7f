"""Bind normalised adapters to a held H3 transformer: attach, change alpha/strength at run time, detach.

Canonical targets are the unfused diffusers Linear names (``transformer_blocks.N.attn.to_q`` …). When the
transformer was fused at load time (``attn.to_qkv``, blocked ``[q; k; v]``), the three q/k/v targets of a block bind
to its ``to_qkv`` as groups 0/1/2: one shared ``A`` (a native fused adapter) gives a 2D delta, anything else a
stacked 3D delta.

Transaction rule: every change validates first and touches nothing on failure; once binding starts, an exception
anywhere rolls every touched layer back to its previous state (modules re-installed, weights re-merged from or
restored to the pristine copy), so the base weights are bitwise what they were.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import torch
import torch.nn as nn

from ..adapters.fit import RANK_FLOOR, rank_limit
from ..adapters.types import ModuleLoRA, NormalisedAdapter
from ..errors import H3AppError
from ..rules.alpha_source import AlphaSource
from ..rules.h3_modules import GROUPS, group_of
from ..settings import LoRASettings, MODES, check_alpha, check_strength
from ..rules.scale import scale_divisor
from .delta import stack_group_factors
from .layers import LoRAFactors, LoRALinear, delta_dtype, is_fake, is_mergeable
from .pristine import PristineStore
from .profile import NormMemo, StrengthProfile, TargetStrength, block_of, build_profile, suggest_alpha
from .report import MatchError, MatchReport, ShapeError, TargetMatch
from .scaling import AdapterScale, ModuleAlpha

QKV_NAMES = ("to_q", "to_k", "to_v")


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Any = _Unchanged()


@dataclass(frozen=True)
class TargetSlot:
    """Where a canonical target lives: ``module`` (its own Linear, or the fused ``to_qkv``), which row group of that
    module (``index`` of ``groups``), and the target's own ``[out_features, in_features]``."""

    target: str
    module: str
    index: int
    groups: int
    out_features: int
    in_features: int
    group: str


def discover_targets(transformer: nn.Module) -> dict[str, TargetSlot]:
    """Every LoRA-able Linear of ``transformer`` as canonical target → slot (works on the meta device).

    A fused attention (``fused_projections`` with ``to_qkv``) contributes its three canonical q/k/v targets to
    ``to_qkv``; any split ``to_q/k/v`` left beside it is unused by the fused processor and is skipped.
    """
    slots: dict[str, TargetSlot] = {}
    wrapped: list[str] = []
    fused_attention: set[str] = set()
    for name, module in transformer.named_modules():
        if getattr(module, "fused_projections", False) and isinstance(getattr(module, "to_qkv", None), (nn.Linear, LoRALinear)):
            fused_attention.add(name)
    for name, module in transformer.named_modules():
        if any(name.startswith(prefix) for prefix in wrapped):
            continue
        if isinstance(module, LoRALinear):
            wrapped.append(name + ".")
            linear: nn.Module = module.base
        elif isinstance(module, nn.Linear):
            linear = module
        else:
            continue
        parent, _, attr = name.rpartition(".")
        out_features, in_features = int(linear.out_features), int(linear.in_features)
        if attr == "to_qkv" and parent in fused_attention:
            if out_features % 3:
                raise H3AppError(f"{name} has {out_features} rows, not a multiple of 3: it is not a blocked [q; k; v] projection.")
            for index, qkv in enumerate(QKV_NAMES):
                target = f"{parent}.{qkv}"
                slots[target] = TargetSlot(target, name, index, 3, out_features // 3, in_features, group_of(target))
            continue
        if attr in QKV_NAMES and parent in fused_attention:
            continue
        slots[name] = TargetSlot(name, name, 0, 1, out_features, in_features, group_of(name))
    return slots


@dataclass
class _Binding:
    """One bound module: its parent and attribute, the original Linear and the wrapper that carries the entries."""

    path: str
    parent: nn.Module
    attr: str
    wrapper: LoRALinear

    @property
    def original(self) -> nn.Linear:
        return self.wrapper.base  # type: ignore[return-value]

    def install(self, module: nn.Module) -> None:
        if getattr(self.parent, self.attr) is not module:
            setattr(self.parent, self.attr, module)


@dataclass
class _Attached:
    settings: LoRASettings
    state: AdapterScale
    entries: dict[str, LoRAFactors]
    adapter: NormalisedAdapter
    modules: dict[str, ModuleLoRA]
    slots: dict[str, TargetSlot]
    unmatched_keys: tuple[str, ...]
    absent_targets: tuple[str, ...]
    uncovered_targets: tuple[str, ...]
    warnings: tuple[str, ...] = ()


@dataclass
class _Plan:
    report: MatchReport
    matched: dict[str, ModuleLoRA]


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
        self._bindings: dict[str, _Binding] = {}
        self._adapters: dict[str, _Attached] = {}
        self._mode = "unmerged"
        self._pristine = pristine if pristine is not None else PristineStore()
        self._norms = NormMemo()

    # ----------------------------------------------------------------------------------------------- queries
    @property
    def mode(self) -> str:
        return self._mode

    @property
    def pristine(self) -> PristineStore:
        """Merged mode's base copies (set ``pristine.device_budget`` to bound the accelerator memory they take)."""
        return self._pristine

    @property
    def factor_bytes(self) -> int:
        """Bytes of every attached adapter's factors as the engine keeps them (on the device, in ``delta_dtype``);
        a factor shared by several targets counts once."""
        seen: dict[int, int] = {}
        for binding in self._bindings.values():
            for entry in binding.wrapper.lora_entries:
                for factor in (entry.down, entry.up):
                    seen[id(factor)] = factor.numel() * factor.element_size()
        return sum(seen.values())

    @property
    def fused_qkv(self) -> bool:
        return any(slot.groups == 3 for slot in self._slots.values())

    @property
    def targets(self) -> Mapping[str, TargetSlot]:
        return dict(self._slots)

    def active(self) -> dict[str, LoRASettings]:
        """The settings each attached adapter runs at now (``mode`` is the engine's)."""
        return {name: dataclasses.replace(a.settings, mode=self._mode) for name, a in self._adapters.items()}

    def effective_scales(self, name: str) -> dict[str, float]:
        """Canonical target → float64 effective scale now in use."""
        attached = self._get(name)
        return {t: attached.state.scale(attached.slots[t].group, ModuleAlpha.of(m)) for t, m in attached.modules.items()}

    def report(self, name: str) -> MatchReport:
        """The match report of an attached adapter at its current settings, its strength profile computed now (the
        norms it needs are measured on the first request and memoised per adapter)."""
        report = self._build_report(name, self._get(name))
        report.profile  # noqa: B018 - measured here, on the thread that owns the engine
        return report

    # ---------------------------------------------------------------------------------------------- matching
    def match(self, adapter: NormalisedAdapter, settings: LoRASettings | None = None, name: str = "adapter") -> MatchReport:
        """Validate ``adapter`` against this transformer without binding anything (shape errors included, no
        profile)."""
        settings = settings or LoRASettings(source=adapter.identity or name)
        return self._plan(adapter, settings, name).report

    def _plan(self, adapter: NormalisedAdapter, settings: LoRASettings, name: str) -> _Plan:
        matched: dict[str, ModuleLoRA] = {}
        absent: list[str] = []
        absent_keys: list[str] = []
        errors: list[ShapeError] = []
        for target, module in adapter.modules.items():
            slot = self._slots.get(target)
            if slot is None:
                absent.append(target)
                absent_keys.extend(module.source_keys or (target,))
                continue
            problem = _shape_problem(module, slot)
            if problem:
                errors.append(ShapeError(target, (slot.out_features, slot.in_features), tuple(module.down.shape),
                                         tuple(module.up.shape), problem))
                continue
            matched[target] = module
        state = _adapter_scale(matched, settings)
        matches = tuple(self._target_match(target, module, state) for target, module in matched.items())
        report = MatchReport(
            name=name,
            identity=adapter.identity,
            mode=self._mode if self._adapters else settings.mode,
            fused_qkv=self.fused_qkv,
            matched=matches,
            unmatched_keys=tuple(dict.fromkeys((*adapter.unmatched_keys, *absent_keys))),
            absent_targets=tuple(absent),
            uncovered_targets=tuple(t for t in self._slots if t not in adapter.modules),
            shape_errors=tuple(errors),
        )
        return _Plan(report, matched)

    def _target_match(self, target: str, module: ModuleLoRA, state: AdapterScale) -> TargetMatch:
        slot = self._slots[target]
        stored = ModuleAlpha.of(module)
        return TargetMatch(target=target, module=slot.module, group=slot.group, rank=module.rank,
                           alpha=state.alpha_in_use(stored), alpha_source=state.alpha_source(module.alpha_source),
                           use_rslora=module.use_rslora, scale=state.scale(slot.group, stored))

    # ------------------------------------------------------------------------------------------------ attach
    def attach(self, adapter: NormalisedAdapter, settings: LoRASettings, name: str) -> MatchReport:
        """Bind ``adapter`` under ``name`` at ``settings`` (alpha, strength, group strengths, mode).

        Raises ``MatchError`` (an ``H3AppError`` carrying the report) when any target has a shape error or nothing
        matched; then nothing is applied. Mode is engine-wide: attaching with another mode than the engine's
        switches every adapter to it.
        """
        if name in self._adapters:
            raise H3AppError(f"an adapter named {name!r} is already attached: detach it first, or change it with set_lora.")
        _check_groups(settings.group_strengths)
        plan = self._plan(adapter, settings, name)
        report = plan.report
        if report.shape_errors:
            first = "; ".join(e.describe() for e in report.shape_errors[:3])
            more = f" (and {len(report.shape_errors) - 3} more)" if len(report.shape_errors) > 3 else ""
            raise MatchError(
                f"adapter {name!r} does not fit this model: {len(report.shape_errors)} shape errors: {first}{more}; "
                f"nothing was applied — is it for another model (e.g. a pruned H3)?", report)
        if not report.matched:
            sample = ", ".join(list(report.unmatched_keys)[:3]) or "none"
            raise MatchError(
                f"adapter {name!r} matched no layer of this model ({len(report.unmatched_keys)} keys unmatched, "
                f"e.g. {sample}): check that it is an H3 LoRA for this partition.", report)

        _check_ranks(name, plan.matched, self._slots)
        mode = self._mode if self._adapters else settings.mode
        paths = sorted({self._slots[t].module for t in plan.matched})
        if mode == "merged":
            self._check_mergeable(paths)
        state = _adapter_scale(plan.matched, settings)
        entries = self._build_entries(name, plan.matched, state)
        attached = _Attached(
            settings=settings, state=state, entries=entries, adapter=adapter, modules=dict(plan.matched),
            slots={t: self._slots[t] for t in plan.matched}, unmatched_keys=report.unmatched_keys,
            absent_targets=report.absent_targets, uncovered_targets=report.uncovered_targets,
            warnings=self._warnings(adapter, plan.matched, settings, report),
        )

        def change() -> None:
            for path, entry in entries.items():
                self._binding(path).wrapper.add_entry(entry)

        self._transaction(paths, change, mode=mode)
        self._adapters[name] = attached
        if settings.mode != self._mode:
            try:
                self.set_mode(settings.mode)
            except BaseException:
                self.detach(name)
                raise
        return self._build_report(name, attached)

    def _build_entries(self, name: str, matched: Mapping[str, ModuleLoRA], state: AdapterScale
                       ) -> dict[str, LoRAFactors]:
        """One entry per bound module, with factors on its device in ``delta_dtype`` (fp32; the base's half dtype on
        CUDA): one pass over each factor (a conversion, or none when it already is in that dtype and contiguous
        there; a factor shared by several targets is converted once)."""
        converted: dict[tuple[int, torch.device, torch.dtype], torch.Tensor] = {}
        by_module: dict[str, list[tuple[TargetSlot, ModuleLoRA]]] = {}
        for target, module in matched.items():
            slot = self._slots[target]
            by_module.setdefault(slot.module, []).append((slot, module))

        entries: dict[str, LoRAFactors] = {}
        for path, members in sorted(by_module.items()):
            device = self._factor_device or self._weight(path).device
            dtype = delta_dtype(device, self._weight(path).dtype)

            def convert(tensor: torch.Tensor, device: torch.device = device, dtype: torch.dtype = dtype) -> torch.Tensor:
                key = (id(tensor), device, dtype)
                if key not in converted:
                    converted[key] = tensor.detach().to(device=device, dtype=dtype).contiguous()
                return converted[key]

            first_slot = members[0][0]
            if first_slot.groups == 1:
                slot, module = members[0]
                scale = state.entry_for(slot.group, (ModuleAlpha.of(module),), device)
                entries[path] = LoRAFactors(name, scale, convert(module.down), convert(module.up))
                continue
            by_index: list[ModuleLoRA | None] = [None] * first_slot.groups
            for slot, module in members:
                by_index[slot.index] = module
            entries[path] = self._fused_entry(name, state, first_slot, by_index, convert, device, dtype)
        return entries

    def _fused_entry(self, name: str, state: AdapterScale, slot: TargetSlot, by_index: list[ModuleLoRA | None],
                     convert, device: torch.device, dtype: torch.dtype) -> LoRAFactors:
        covered = [m for m in by_index if m is not None]
        first = covered[0]
        shared_down = all(_same_tensor(m.down, first.down) for m in covered[1:])
        stored = [ModuleAlpha.of(m) if m is not None else None for m in by_index]
        if shared_down and len({s for s in stored if s is not None}) == 1:
            # Native fused source: one A, blocked [B_q; B_k; B_v] (zero rows for an uncovered group): a 2D delta.
            up = torch.zeros(slot.groups * slot.out_features, first.rank, dtype=dtype, device=device)
            for index, module in enumerate(by_index):
                if module is not None:
                    up[index * slot.out_features:(index + 1) * slot.out_features].copy_(module.up.detach())
            return LoRAFactors(name, state.entry_for(slot.group, (ModuleAlpha.of(first),), device), convert(first.down), up)
        down, up = stack_group_factors(
            [(m.down.detach(), m.up.detach()) if m is not None else None for m in by_index],
            out_features_per_group=slot.out_features, in_features=slot.in_features, dtype=dtype, device=device)
        return LoRAFactors(name, state.entry_for(slot.group, tuple(stored), device), down, up)

    # ------------------------------------------------------------------------------------------- set / mode
    def set_lora(self, name: str, *, alpha: float | None = UNCHANGED, strength: float = UNCHANGED,
                 group_strengths: Mapping[str, float] = UNCHANGED) -> LoRASettings:
        """Change an attached adapter's alpha (None = each module's stored alpha), strength and/or group strengths
        without reading its file again; an argument left out (``UNCHANGED``) keeps its value. O(1) in unmerged
        mode; merged mode re-merges its layers from the pristine copies. Returns the new settings."""
        attached = self._get(name)
        old = attached.settings
        new_alpha = old.alpha if alpha is UNCHANGED else check_alpha(alpha)
        new_strength = old.strength if strength is UNCHANGED else check_strength(strength)
        new_groups = dict(old.group_strengths) if group_strengths is UNCHANGED else dict(group_strengths)
        _check_groups(new_groups)
        for group, value in new_groups.items():
            check_strength(value, what=f"strength of group {group!r}")
        new = dataclasses.replace(old, alpha=new_alpha, strength=new_strength, group_strengths=new_groups)
        if self._mode == "unmerged":
            attached.state.update(new.alpha, new.strength, new.group_strengths)
            attached.settings = new
            return new

        self._transaction(
            list(attached.entries),
            lambda: attached.state.update(new.alpha, new.strength, new.group_strengths),
            undo=lambda: attached.state.update(old.alpha, old.strength, old.group_strengths),
            mode=self._mode)
        attached.settings = new
        return new

    def set_mode(self, mode: str) -> None:
        """Switch every attached adapter to ``unmerged`` or ``merged`` (refused with the reason when the base
        cannot be merged or no room is left for its pristine copy)."""
        if mode not in MODES:
            raise H3AppError(f"mode must be one of {', '.join(MODES)}, got {mode!r}.")
        if mode == self._mode:
            return
        paths = list(self._bindings)
        if mode == "merged":
            self._check_mergeable(paths)
        self._transaction(paths, lambda: None, mode=mode)

    # ------------------------------------------------------------------------------------------------ detach
    def detach(self, name: str | None = None) -> None:
        """Remove one adapter (or all with None). Layers left without adapters get their original module back,
        with weights bitwise equal to the base."""
        names = list(self._adapters) if name is None else [name]
        for each in names:
            self._get(each)
        paths = sorted({path for each in names for path in self._adapters[each].entries})

        def change() -> None:
            for each in names:
                for path in self._adapters[each].entries:
                    self._bindings[path].wrapper.remove_adapter(each)

        self._transaction(paths, change, mode=self._mode)
        for each in names:
            del self._adapters[each]

    # ----------------------------------------------------------------------------------------- transactions
    def _transaction(self, paths: Iterable[str], change: Callable[[], None], *, mode: str,
                     undo: Callable[[], None] | None = None) -> None:
        """Run ``change`` (edits entry lists or scale state), then bring ``paths`` to ``mode``. On any exception:
        ``undo``, restore the entry lists and the previous mode, and bring every touched path back (weights
        re-merged from, or restored to, the pristine copies — bitwise what they were)."""
        paths = list(paths)
        old_mode = self._mode
        if mode == "merged":
            new = [self._weight(p) for p in paths if p not in self._pristine]
            devices = {w.device for w in new}
            self._pristine.reserve(sum(_nbytes(w) for w in new), devices.pop() if len(devices) == 1 else None)
        saved = {path: list(self._binding(path).wrapper.lora_entries) for path in paths}
        try:
            change()
            self._mode = mode
            self._bring_to_mode(paths, mode)
        except BaseException as error:
            self._mode = old_mode
            try:
                if undo is not None:
                    undo()
                for path, entries in saved.items():
                    self._bindings[path].wrapper.lora_entries = entries
                self._bring_to_mode(paths, old_mode)
            except BaseException as rollback_error:  # pragma: no cover - a second failure; report both
                raise H3AppError(
                    f"LoRA change failed ({error}) and so did its rollback ({rollback_error}): reload the model."
                ) from error
            raise
        finally:
            for path in paths:
                binding = self._bindings.get(path)
                if binding is not None and not binding.wrapper.lora_entries and path not in self._pristine:
                    del self._bindings[path]

    def _bring_to_mode(self, paths: list[str], mode: str) -> None:
        """Make each path's installed module and weight match its entries in ``mode``."""
        for path in paths:
            binding = self._bindings[path]
            wrapper = binding.wrapper
            if mode == "merged" and wrapper.lora_entries:
                binding.install(binding.original)
                if path not in self._pristine:
                    self._pristine.put(path, binding.original.weight)
                wrapper.merge_from(self._pristine, path)
                continue
            if path in self._pristine:
                wrapper.restore_from(self._pristine, path)
                self._pristine.pop(path)
            binding.install(wrapper if wrapper.lora_entries else binding.original)

    # ----------------------------------------------------------------------------------------------- helpers
    def _get(self, name: str) -> _Attached:
        try:
            return self._adapters[name]
        except KeyError:
            attached = ", ".join(self._adapters) or "none"
            raise H3AppError(f"no adapter named {name!r} is attached (attached: {attached}).") from None

    def _binding(self, path: str) -> _Binding:
        binding = self._bindings.get(path)
        if binding is None:
            parent_path, _, attr = path.rpartition(".")
            parent = self.transformer.get_submodule(parent_path) if parent_path else self.transformer
            module = getattr(parent, attr)
            wrapper = module if isinstance(module, LoRALinear) else LoRALinear(module)
            binding = _Binding(path, parent, attr, wrapper)
            self._bindings[path] = binding
        return binding

    def _weight(self, path: str) -> torch.Tensor:
        binding = self._bindings.get(path)
        if binding is not None:
            return binding.original.weight
        module = self.transformer.get_submodule(path)
        return module.base.weight if isinstance(module, LoRALinear) else module.weight

    def _check_mergeable(self, paths: Iterable[str]) -> None:
        for path in paths:
            reason = is_mergeable(self._weight(path))
            if reason:
                raise H3AppError(f"merged mode is not available: {path}: {reason}; use unmerged mode.")

    def _warnings(self, adapter: NormalisedAdapter, matched: Mapping[str, ModuleLoRA], settings: LoRASettings,
                  report: MatchReport) -> tuple[str, ...]:
        """Keys that matched nothing; and, when no alpha is stored or given, an alpha far off the usual range (the
        only part of attach that measures norms, and only those of the rank-fallback targets)."""
        warnings: list[str] = []
        if report.unmatched_keys:
            sample = ", ".join(list(report.unmatched_keys)[:3])
            warnings.append(f"{len(report.unmatched_keys)} adapter keys matched nothing in this model (e.g. {sample}).")
        fallback = {t: m for t, m in matched.items() if m.alpha_source == AlphaSource.RANK_FALLBACK}
        if settings.alpha is None and fallback and self._measurable(fallback):
            updates = self._norms.update_norms(adapter, fallback, self._norm_device)
            suggestion = suggest_alpha(
                updates, self._norms.weight_norms(fallback, self._base_rows), {t: m.rank for t, m in fallback.items()},
                {t: scale_divisor(m.rank, m.use_rslora) for t, m in fallback.items()})
            if suggestion is not None:
                warnings.append(suggestion.message())
        return tuple(warnings)

    def _measurable(self, modules: Mapping[str, ModuleLoRA]) -> bool:
        """False on the meta device and on fake tensors (shapes without data: nothing to measure)."""
        return not any(_no_data(m.down) or _no_data(m.up) or _no_data(self._weight(self._slots[t].module))
                       for t, m in modules.items())

    def _norm_device(self, target: str) -> torch.device:
        return self._factor_device or self._weight(self._slots[target].module).device

    def _base_rows(self, target: str) -> torch.Tensor:
        """The base weight rows of ``target`` (from the pristine copy while merged weights are in place)."""
        slot = self._slots[target]
        weight = self._pristine.full(slot.module) if slot.module in self._pristine else self._weight(slot.module)
        return weight[slot.index * slot.out_features:(slot.index + 1) * slot.out_features]

    def _profile(self, attached: _Attached, matches: tuple[TargetMatch, ...]) -> StrengthProfile | None:
        if not self._measurable(attached.modules):
            return None
        updates = self._norms.update_norms(attached.adapter, attached.modules, self._norm_device)
        weights = self._norms.weight_norms(attached.modules, self._base_rows)
        return build_profile(TargetStrength(m.target, block_of(m.target), m.group, m.scale, updates[m.target],
                                            weights[m.target]) for m in matches)

    def _build_report(self, name: str, attached: _Attached) -> MatchReport:
        """The report at the current settings; its profile is measured on first access."""
        matches = tuple(self._target_match(t, m, attached.state) for t, m in attached.modules.items())
        return MatchReport(
            name=name, identity=attached.adapter.identity, mode=self._mode, fused_qkv=self.fused_qkv, matched=matches,
            unmatched_keys=attached.unmatched_keys, absent_targets=attached.absent_targets,
            uncovered_targets=attached.uncovered_targets, shape_errors=(), warnings=attached.warnings,
            measure=lambda: self._profile(attached, matches))


def _shape_problem(module: ModuleLoRA, slot: TargetSlot) -> str | None:
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


def _check_ranks(name: str, matched: Mapping[str, ModuleLoRA], slots: Mapping[str, TargetSlot]) -> None:
    """Refuse a rank above ``in + out`` (no LoRA needs one: rank ``min(in, out)`` already spans every update; a
    hostile file would make later steps cost ``O(rank²)``). Ranks up to ``RANK_FLOOR`` always pass, so that small
    models accept the ranks published adapters use."""
    for target, module in matched.items():
        slot = slots[target]
        limit = rank_limit(slot.out_features, slot.in_features)
        if module.rank > limit:
            raise H3AppError(
                f"adapter {name!r}: {target} has rank {module.rank}, above the limit {limit} for its "
                f"[{slot.out_features}, {slot.in_features}] layer (in + out, at least {RANK_FLOOR}): the file is "
                f"malformed; nothing was applied — use a LoRA with a sane rank.")


def _adapter_scale(matched: Mapping[str, ModuleLoRA], settings: LoRASettings) -> AdapterScale:
    return AdapterScale((ModuleAlpha.of(m) for m in matched.values()), settings.alpha, settings.strength,
                        settings.group_strengths)


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` are one factor (the same object or view, or — with data — equal values)."""
    if a is b:
        return True
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_meta or b.is_meta:
        return False
    if a.device == b.device and a.data_ptr() == b.data_ptr() and a.stride() == b.stride():
        return True
    return bool(torch.equal(a, b))


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _check_groups(group_strengths: Mapping[str, float]) -> None:
    unknown = [group for group in group_strengths if group not in GROUPS]
    if unknown:
        raise H3AppError(f"unknown group {unknown[0]!r} in group strengths: use {', '.join(GROUPS)}.")


def _no_data(tensor: torch.Tensor) -> bool:
    """A tensor with a shape but no values: meta, or a fake tensor (the full-size rehearsal's fake CUDA)."""
    return tensor.is_meta or is_fake(tensor)
