"""The alpha chain (docs/adapters.md, "The alpha chain"), resolved per module, every value with its provenance.

    explicit > the module's ``.alpha`` tensor > ``adapter_config.json`` > in-file metadata > known-adapter registry > rank

Scale per module = alpha × strength / rank (``/ √rank`` with rsLoRA). An explicit alpha replaces alpha only: an
rsLoRA adapter stays rsLoRA. Alpha values stay exact floats (never ``int()``). ``ss_network_alpha`` is a hint,
never applied: it is the trainer's global flag and may disagree with the tensors.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import H3AppError
from ..rules.alpha_source import AlphaSource
from ..rules.values import parse_number
from ..settings import check_alpha
from .formats import MAIN_PARTITION, ModulePlan
from .known import KnownAdapter
from .types import HeaderView

EXPLICIT = AlphaSource.EXPLICIT
MODULE_TENSOR = AlphaSource.MODULE_TENSOR
ADAPTER_CONFIG = AlphaSource.ADAPTER_CONFIG
METADATA = AlphaSource.METADATA
REGISTRY = AlphaSource.REGISTRY
RANK_FALLBACK = AlphaSource.RANK_FALLBACK
MIXED = AlphaSource.MIXED

LORA_ADAPTER_METADATA = "lora_adapter_metadata"
PEFT_DEFAULT_LORA_ALPHA = 8.0  # peft.LoraConfig's lora_alpha when adapter_config.json gives none
PLAIN_METADATA_ALPHAS = ("alpha", "lora_alpha", "network_alpha")  # in this order of preference
HINT_METADATA = ("ss_network_alpha", "ss_network_dim", "ss_network_module", "ss_base_model_version",
                 "modelspec.architecture", "modelspec.trigger_phrase", "modelspec.title")


@dataclass(frozen=True)
class AlphaChoice:
    """The alpha of one module and where it came from (one of ``TIERS``)."""

    alpha: float
    source: AlphaSource
    use_rslora: bool = False


@dataclass(frozen=True)
class AlphaResolution:
    """Per canonical target: its alpha choice. ``warnings`` name conflicts and fallbacks; ``hints`` are shown only."""

    choices: Mapping[str, AlphaChoice]
    warnings: tuple[str, ...]
    hints: Mapping[str, Any]


def get_pattern_key(pattern_keys: Iterable[str], key_to_match: str) -> str:
    """PEFT's rule for ``rank_pattern``/``alpha_pattern`` (peft.utils.other.get_pattern_key, peft 0.21): the first
    pattern that matches the end of the module name at a dot boundary; the name itself when none does."""
    for key in pattern_keys:
        if re.match(rf"(.*\.)?({key})$", key_to_match):
            return key
    return key_to_match


def pattern_value(pattern: Mapping[str, Any], module: str, default: Any) -> Any:
    """The value of ``pattern`` (an ``alpha_pattern``/``rank_pattern``) whose key matches ``module`` as PEFT matches
    it, else ``default`` (the config's ``lora_alpha``/``r``)."""
    key = get_pattern_key(pattern.keys(), module)
    return pattern[key] if key in pattern else default


@dataclass(frozen=True)
class _PeftSettings:
    """What an adapter_config.json or a lora_adapter_metadata JSON says about alpha."""

    where: str
    lora_alpha: float | None
    alpha_pattern: Mapping[str, float]
    r: int | None
    rank_pattern: Mapping[str, int]
    use_rslora: bool | None
    alpha_defaulted: bool = False  # lora_alpha absent: PEFT's default applies

    def alpha_for(self, module: str) -> float | None:
        return pattern_value(self.alpha_pattern, module, self.lora_alpha)

    def rank_for(self, module: str) -> int | None:
        return pattern_value(self.rank_pattern, module, self.r)


def resolve_alphas(
    modules: Sequence[ModulePlan],
    view: HeaderView,
    *,
    explicit_alpha: float | None = None,
    known: KnownAdapter | None = None,
) -> AlphaResolution:
    """Resolve the alpha of every target of ``modules`` (all targets of one module share its alpha).

    Raises ``H3AppError`` for an invalid explicit alpha, or a stored ``.alpha`` that is negative, NaN or infinite.
    """
    explicit = check_alpha(explicit_alpha)  # typed where it entered: range-checked here, not parsed again
    warnings: list[str] = []
    said = _read_file_settings(view, {m.file_partition for m in modules}, warnings)
    tally = _Tally()
    rslora: dict[str, bool] = {}  # per file partition
    choices: dict[str, AlphaChoice] = {}
    for module in modules:
        if module.alpha_applies:
            candidates = _candidates(module, view, explicit, said, known, tally)
            source, alpha = _choose(candidates, module, said.config, tally)
        else:
            source, alpha = _alpha_not_applied(module, view, explicit, tally)
        if module.file_partition not in rslora:
            rslora[module.file_partition] = _use_rslora(said.config, said.metadata.get(module.file_partition),
                                                        warnings)
        choice = AlphaChoice(float(alpha), source, rslora[module.file_partition])
        for target in module.targets:
            choices[target] = choice
    warnings.extend(tally.warnings())
    return AlphaResolution(choices=choices, warnings=tuple(dict.fromkeys(warnings)), hints=_hints(view.metadata))


@dataclass(frozen=True)
class _FileSettings:
    """What the file says about alpha besides its ``.alpha`` tensors, read once per resolution."""

    config: _PeftSettings | None  # adapter_config.json beside it
    metadata: Mapping[str, _PeftSettings | None]  # lora_adapter_metadata, per file partition
    plain: float | None  # the header's plain alpha / lora_alpha / network_alpha


def _read_file_settings(view: HeaderView, partitions: set[str], warnings: list[str]) -> _FileSettings:
    """adapter_config.json, the metadata of each file partition in ``partitions``, and the plain metadata alpha."""
    has_magnitudes = any("lora_magnitude_vector" in key for key in view.tensors)
    config = _peft_settings_from_config(view.adapter_config, view.name, warnings, has_magnitudes)
    metadata = {partition: _peft_settings_from_metadata(view.metadata, partition, warnings)
                for partition in partitions}
    return _FileSettings(config, metadata, _plain_metadata_alpha(view.metadata, warnings))


@dataclass
class _Tally:
    """What resolving the modules one by one noticed, said once for all of them when done."""

    zero_alpha: list[str] = field(default_factory=list)  # .alpha keys that store 0
    conflicts: dict[tuple[AlphaSource, float, AlphaSource, float], int] = field(
        default_factory=lambda: defaultdict(int))  # (winner, its alpha, loser, its alpha) → modules
    defaulted: int = 0  # modules given PEFT's default lora_alpha
    rank_mismatch: list[str] = field(default_factory=list)
    fallback: list[ModulePlan] = field(default_factory=list)  # modules at alpha = rank
    not_applied: list[str] = field(default_factory=list)  # modules whose kind ignores alpha (scale 1 × strength)

    def warnings(self) -> list[str]:
        said: list[str] = []
        if self.zero_alpha:
            said.append(
                f"{len(self.zero_alpha)} modules store alpha 0 (e.g. {self.zero_alpha[0]!r}), which means alpha = "
                "rank (kohya's convention): using alpha = rank for them."
            )
        for (winner, winner_alpha, loser, loser_alpha), count in sorted(self.conflicts.items(),
                                                                        key=lambda item: -item[1]):
            said.append(
                f"alpha {_fmt(winner_alpha)} from {_describe(winner)} wins over alpha {_fmt(loser_alpha)} from "
                f"{_describe(loser)} ({count} modules)."
            )
        if self.defaulted:
            said.append(
                f"adapter_config.json gives no lora_alpha: PEFT's default {_fmt(PEFT_DEFAULT_LORA_ALPHA)} applies to "
                f"{self.defaulted} modules, as PEFT itself loads this adapter; set alpha if the model card says "
                "otherwise."
            )
        if self.rank_mismatch:
            said.append(f"{self.rank_mismatch[0]} ({len(self.rank_mismatch)} modules); the tensors' rank is used.")
        if self.fallback:
            said.append(_fallback_warning(self.fallback))
        if self.not_applied:
            said.append(f"{len(self.not_applied)} LoKr modules store both Kronecker factors whole (e.g. "
                        f"{self.not_applied[0]!r}): LyCORIS runs them at scale 1 × strength and their alpha does not "
                        "apply, so alpha 8 / strength 1 and alpha 128 / strength 0.0625 are not the same run for them.")
        return said


FASTVIDEO_FORMAT = "fastvideo-lora-v2"  # FastVideo's LoRA files (FastH3): the format fixes the scale at 1


def _candidates(module: ModulePlan, view: HeaderView, explicit: float | None, said: _FileSettings,
                known: KnownAdapter | None, tally: _Tally) -> list[tuple[AlphaSource, float]]:
    """Every alpha the chain offers ``module``, highest tier first: explicit, its ``.alpha`` tensor,
    adapter_config.json, metadata (``lora_adapter_metadata``, then the plain fields), the registry. The last tier,
    rank, is :func:`_choose`'s fallback."""
    candidates: list[tuple[AlphaSource, float]] = []
    if explicit is not None:
        candidates.append((EXPLICIT, explicit))
    if module.alpha_key is not None:
        candidates.append((MODULE_TENSOR, _stored_alpha(module, module.alpha_key, view, tally)))
    for tier, settings in ((ADAPTER_CONFIG, said.config), (METADATA, said.metadata.get(module.file_partition))):
        if settings is not None:
            value = settings.alpha_for(module.peft_name)
            if value is not None:
                candidates.append((tier, value))
            stated_rank = settings.rank_for(module.peft_name)
            if stated_rank is not None and stated_rank != module.rank:
                tally.rank_mismatch.append(f"{settings.where} says r={stated_rank} for {module.peft_name!r}, the "
                                           f"tensors have rank {module.rank}")
    if said.plain is not None:
        candidates.append((METADATA, said.plain))
    elif view.metadata.get("format") == FASTVIDEO_FORMAT:  # its ``application``: W + B @ A, i.e. alpha = rank
        candidates.append((METADATA, float(module.rank)))
    if known is not None and known.alpha is not None:
        candidates.append((REGISTRY, known.alpha))
    elif known is not None and known.alpha_equals_rank:
        candidates.append((REGISTRY, float(module.rank)))
    return candidates


def _alpha_not_applied(module: ModulePlan, view: HeaderView, explicit: float | None,
                       tally: _Tally) -> tuple[AlphaSource, float]:
    """A module whose kind's loader ignores alpha (a LoKr with both factors whole: LyCORIS and ComfyUI run it at
    scale 1): alpha 1 over rank 1; an explicit alpha cannot change it, so it is refused in one line."""
    if explicit is not None:
        raise H3AppError(f"{view.name}: alpha does not apply to its {module.kind} module {module.stem!r} (both "
                         "Kronecker factors stored whole: LyCORIS and ComfyUI run it at scale 1 × strength, whatever "
                         "alpha), so alpha × strength is not the scale; leave alpha on auto and set the strength.")
    tally.not_applied.append(module.stem)
    return (MODULE_TENSOR if module.alpha_key is not None else RANK_FALLBACK), 1.0


def _stored_alpha(module: ModulePlan, alpha_key: str, view: HeaderView, tally: _Tally) -> float:
    """``module``'s ``.alpha`` scalar (at ``alpha_key``); 0 means rank (kohya's convention); negative, NaN or inf
    refuse the file."""
    stored = view.scalars[alpha_key]
    if not math.isfinite(stored) or stored < 0:
        raise H3AppError(
            f"{view.name}: {alpha_key!r} stores alpha {stored!r}: a LoRA alpha must be a finite number "
            "≥ 0; the file is damaged — re-export it, or give alpha explicitly after fixing it."
        )
    if stored == 0:
        tally.zero_alpha.append(alpha_key)
        return float(module.rank)
    return stored


def _choose(candidates: list[tuple[AlphaSource, float]], module: ModulePlan, config: _PeftSettings | None,
            tally: _Tally) -> tuple[AlphaSource, float]:
    """The highest tier's ``(source, alpha)``, else rank; the lower tiers that disagree are tallied."""
    if not candidates:
        tally.fallback.append(module)
        return RANK_FALLBACK, float(module.rank)
    source, alpha = candidates[0]
    if source == ADAPTER_CONFIG and config is not None and config.alpha_defaulted:
        tally.defaulted += 1
    for other_source, other_alpha in candidates[1:]:
        if other_alpha != alpha and other_source != source:
            tally.conflicts[(source, alpha, other_source, other_alpha)] += 1
    return source, alpha


def summarise(choices: Mapping[str, AlphaChoice]) -> tuple[float | None, AlphaSource]:
    """``(alpha, alpha_source)`` for AdapterInfo: the common value (None when they differ) and source (or "mixed")."""
    values = {c.alpha for c in choices.values()}
    sources = {c.source for c in choices.values()}
    alpha = next(iter(values)) if len(values) == 1 else None
    source = next(iter(sources)) if len(sources) == 1 else MIXED
    return alpha, source


def _fallback_warning(modules: Sequence[ModulePlan]) -> str:
    ranks = sorted({m.rank for m in modules})
    targets = sum(len(m.targets) for m in modules)
    top = ranks[-1]
    examples = ", ".join(f"trained at alpha {_fmt(a)}: {_fmt(top / a)}×" for a in (top / 2, 1.0) if 1 <= a < top)
    this_file = f" (its rank-{top} modules {examples} too strong)" if examples else ""
    lightx2v = (" LightX2V's rank-128 Turbo expects alpha 8: at alpha = rank it is 16× too strong."
                if 128 in ranks else "")
    return (
        f"no alpha in the file, beside it or in the registry for {targets} targets (rank {', '.join(map(str, ranks))}): "
        f"using alpha = rank (scale 1 × strength). If it was trained with a smaller alpha it is rank/alpha times too "
        f"strong{this_file}.{lightx2v} Set alpha if the model card gives one."
    )


def _describe(source: AlphaSource) -> str:
    return AlphaSource.of(source).short


def _fmt(value: float) -> str:
    return f"{value:g}" if value == round(value, 6) else repr(value)


def _number(value: Any, where: str, warnings: list[str]) -> float | None:
    """A usable alpha from a file: a finite non-zero number (numeric strings accepted, as metadata is text).
    Anything else is a warning and ignored: a file's odd value never blocks inspection; a negative one refuses."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = parse_number(value, where)
    except H3AppError:
        if isinstance(value, (int, float)) or _is_float_text(value):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "…"
            warnings.append(f"{where} is {shown}, not a usable alpha: ignored.")
        else:
            warnings.append(f"{where} is {value!r}, not a number: ignored.")
        return None
    if number < 0:
        raise H3AppError(f"{where} is {number:g}: a negative alpha is not a LoRA scale; fix the file (or give an "
                         f"explicit alpha).")
    if number == 0:
        warnings.append(f"{where} is {value!r}, not a usable alpha: ignored.")
        return None
    return number


def _is_float_text(value: Any) -> bool:
    """Text Python reads as a float (such as ``"inf"`` or ``"nan"``) that ``parse_number`` refuses."""
    try:
        float(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def _pattern(raw: Any, where: str, warnings: list[str], *, integer: bool) -> dict[str, Any]:
    if raw in (None, {}):
        return {}
    if not isinstance(raw, dict):
        warnings.append(f"{where} is not an object: ignored.")
        return {}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            re.compile(str(key))
        except re.error as error:
            raise H3AppError(f"{where} key {str(key)[:60]!r} is not a valid regular expression ({error}): fix the "
                             f"adapter config.") from None
        number = _number(value, f"{where}[{key!r}]", warnings)
        if number is not None:
            out[str(key)] = int(number) if integer else number
    return out


def _settings(raw: Mapping[str, Any], where: str, warnings: list[str]) -> _PeftSettings:
    r = _number(raw.get("r"), f"{where} r", warnings)
    rslora = raw.get("use_rslora")
    return _PeftSettings(
        where=where,
        lora_alpha=_number(raw.get("lora_alpha"), f"{where} lora_alpha", warnings),
        alpha_pattern=_pattern(raw.get("alpha_pattern"), f"{where} alpha_pattern", warnings, integer=False),
        r=int(r) if r is not None else None,
        rank_pattern=_pattern(raw.get("rank_pattern"), f"{where} rank_pattern", warnings, integer=True),
        use_rslora=bool(rslora) if isinstance(rslora, bool) else None,
    )


def _peft_settings_from_config(config: Mapping[str, Any] | None, name: str, warnings: list[str],
                               has_magnitudes: bool = False) -> _PeftSettings | None:
    if not config:
        return None
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise H3AppError(
            f"the adapter_config.json beside {name} is for a {peft_type} adapter, not LoRA: h3app applies plain LoRA only."
        )
    if config.get("use_dora") and not has_magnitudes:
        raise H3AppError(f"the adapter_config.json beside {name} sets use_dora but the file holds no "
                         "lora_magnitude_vector: the DoRA magnitudes are missing; re-save the adapter with PEFT.")
    settings = _settings(config, "adapter_config.json", warnings)
    if "lora_alpha" in config:
        return settings
    return replace(settings, lora_alpha=PEFT_DEFAULT_LORA_ALPHA, alpha_defaulted=True)


def _peft_settings_from_metadata(metadata: Mapping[str, str], partition: str, warnings: list[str]) -> _PeftSettings | None:
    """diffusers' ``lora_adapter_metadata``: a JSON LoraConfig dict with ``<partition>.``-prefixed fields."""
    raw = metadata.get(LORA_ADAPTER_METADATA)
    if not raw:
        return None
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        warnings.append("the file's lora_adapter_metadata is not valid JSON: ignored.")
        return None
    if not isinstance(parsed, dict):
        warnings.append("the file's lora_adapter_metadata is not a JSON object: ignored.")
        return None
    prefix = f"{partition}."
    fields = {k[len(prefix):]: v for k, v in parsed.items() if k.startswith(prefix)}
    if not fields and partition != MAIN_PARTITION:
        fields = {k[len(MAIN_PARTITION) + 1:]: v for k, v in parsed.items() if k.startswith(MAIN_PARTITION + ".")}
    if not fields:
        fields = {k: v for k, v in parsed.items() if "." not in k}
    if not fields:
        return None
    return _settings(fields, "the file's lora_adapter_metadata", warnings)


def _plain_metadata_alpha(metadata: Mapping[str, str], warnings: list[str]) -> float | None:
    numbers = [(key, _number(metadata[key], f"metadata {key}", warnings)) for key in PLAIN_METADATA_ALPHAS if key in metadata]
    found = [(key, value) for key, value in numbers if value is not None]
    if not found:
        return None
    key, value = found[0]
    for other_key, other in found[1:]:
        if other != value:
            warnings.append(
                f"metadata {key} = {_fmt(value)} wins over metadata {other_key} = {_fmt(other)}."
            )
    return value


def _use_rslora(config: _PeftSettings | None, metadata: _PeftSettings | None, warnings: list[str]) -> bool:
    stated = [(s.where, s.use_rslora) for s in (config, metadata) if s is not None and s.use_rslora is not None]
    if not stated:
        return False
    if len({flag for _, flag in stated}) > 1:
        warnings.append(
            f"use_rslora is {stated[0][1]} in {stated[0][0]} but {stated[1][1]} in {stated[1][0]}: {stated[0][0]} wins."
        )
    return stated[0][1]


def _hints(metadata: Mapping[str, str]) -> dict[str, Any]:
    hints: dict[str, Any] = {}
    for key in HINT_METADATA:
        if key in metadata:
            value: Any = metadata[key]
            if key in ("ss_network_alpha", "ss_network_dim"):
                try:
                    value = parse_number(value, key)
                except H3AppError:
                    value = metadata[key]  # not a number: shown as written (a hint is never applied)
            hints[key] = value
    return hints
