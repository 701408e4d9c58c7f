"""Adapter key layouts → canonical targets (the unfused diffusers module names of ``MiniMaxH3Transformer3DModel``).

Works on key names and shapes alone (a ``HeaderView``), so it runs before any weight is read. The result, an
``AdapterPlan``, says for every module of the file which keys hold its factors, which canonical targets it feeds
and how its rows must be reordered (``layout``); ``normalise.py`` then reads the factors and applies it.

Four layouts are in circulation (examples in docs/adapters.md):

- ``native``: the original checkpoint's module names (``blocks.N.attn.qkv_proj``, ``blocks.N.mlp.fc1``, …), bare or
  under ``diffusion_model.`` / ``model.diffusion_model.``. Fused QKV ``lora_B`` rows are blocked ``[q; k; v]``;
  ``mlp.fc1`` rows are ``[gate; up]`` where diffusers' ``ff.net.0.proj`` has ``[value/up; gate]``.
- ``diffsynth``: native names with PEFT's ``.default.`` adapter-slot infix; its fused QKV rows are the raw
  checkpoint's per-head interleave ``[q_h, k_h, v_h] × heads``.
- ``peft``: diffusers names, bare or under ``base_model.model.`` / ``transformer.`` / ``transformer_ref.``, with or
  without the ``.default.`` infix (LightX2V).
- ``kohya``: musubi-tuner's ``lora_unet_`` + flattened module name (every ``.`` → ``_``) + ``lora_down``/``lora_up``
  + ``.alpha``. Un-flattened by matching the whole name against the module vocabulary (native *and* diffusers
  names), never by splitting on ``_``.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import H3AppError
from ..rules.choices import MAIN_PARTITION, PARTITIONS, QKV_LAYOUTS, REFERENCE_PARTITION
from ..rules.module_rules import (  # noqa: F401 — the rule tables, layouts and matchers, re-exported for callers of formats
    DIFFUSERS_MODULES,
    FUSED_QKV,
    NATIVE_MODULES,
    PLAIN,
    SWIGLU_GATE_UP,
    Alternative,
    ModuleRule,
    dotted_name,
    match_module,
    match_name,
    native_vocabulary,
)
from .factor_checks import BLOCKED, FLOAT_DTYPES, INTERLEAVED, check_alpha, check_factors  # noqa: F401
from .kinds import FACTOR_NAMES, check_kind, dense_warning
from .kinds.dora import MAGNITUDE_NAMES, check_magnitude
from .layouts import FLATTENED_PREFIXES
from .parts import PartsPlan, plan_parts, refuse_part_conflicts
from .refusals import refuse_families, refuse_foreign, refuse_no_lora
from .types import HeaderView

LORA_KIND = "lora"
SUFFIX_AB = "lora_A/B"
SUFFIX_DOWN_UP = "lora_down/up"


# Prefixes stripped from the front of a key, repeatedly (``base_model.model.transformer.`` is two of them).
# ``transformer_ref.`` routes a key to the reference partition.
PEFT_SAVE_PREFIX = "base_model.model."
WRAPPER_PREFIXES = (PEFT_SAVE_PREFIX, "model.diffusion_model.", "diffusion_model.", "transformer_ref.",
                    "transformer.", "model.")
# FLATTENED_PREFIXES (kohya, musubi; SimpleTuner's LyCORIS): the flattened layouts' prefixes (``layouts.py``).

# A key is prefix + module stem + factor suffix. The prefix is up to four wrappers, then a flattened kohya prefix; it
# is atomic: wrappers are taken greedily (the first listed that fits, each time) and never given back to make the
# rest fit.
_PREFIX = re.compile(
    "(?>(?:" + "|".join(map(re.escape, WRAPPER_PREFIXES)) + "){0,4}"
    "(?P<flattened>" + "|".join(map(re.escape, FLATTENED_PREFIXES)) + ")?)"
)
_PREFIX_STARTS = WRAPPER_PREFIXES + FLATTENED_PREFIXES
# The factor suffix, searched from one character after the prefix: the leftmost place it fits ends the shortest
# stem (a stem never spans a line break). ``.weight`` is optional after the factor name: sglang's H3 mapping ends
# its patterns at ``lora_[AB]``, so files written for it (``blocks.0.attn.qkv_proj.lora_A``) carry no suffix; a slot
# is never the word ``weight`` itself.
_FACTOR = re.compile(
    r"\.(?:(?P<ab>lora_[AB])(?:\.(?P<slot>(?!(?:weight|bias)$)[A-Za-z0-9_\-]+))?(?:\.weight)?"
    r"|(?P<du>lora_(?:down|up))(?:\.weight)?|(?P<alpha>alpha)"
    r"|(?P<kind>" + FACTOR_NAMES + r")(?:\.weight)?"
    r"|(?P<magnitude>" + MAGNITUDE_NAMES + "))$"
)

@dataclass(frozen=True)
class ModulePlan:
    """One module of the adapter file and the canonical targets it feeds.

    ``stem`` is the module part of its keys as stored (prefix included), ``module`` the same with prefixes stripped
    (what the trainer's PEFT called it; used for ``alpha_pattern``/``rank_pattern``). Factor shapes: lora_A
    ``[rank, in]`` and lora_B ``[out_total, rank]`` (``stacked``: ``[3, rank, in]`` / ``[3, out, rank]``).
    ``target_shapes[i]`` is ``(out_features, in_features)`` of ``targets[i]``.
    """

    stem: str
    module: str
    prefix: str
    format: str
    layout: str
    qkv_order: str
    targets: tuple[str, ...]
    target_shapes: tuple[tuple[int, int], ...]
    rank: int
    down_key: str
    up_key: str
    alpha_key: str | None
    stacked: bool
    file_partition: str
    dtype: str
    suffix_style: str
    kind: str = LORA_KIND  # "lora" (A/B pairs) or a kind of ``kinds/`` (its factors in ``factor_keys``)
    factor_keys: tuple[tuple[str, str], ...] = ()  # (factor name, key) of another kind's factors
    alpha_applies: bool = True  # False: the kind's loader ignores alpha (LoKr with both factors whole)
    magnitude_key: str | None = None  # DoRA's magnitude [out_total] (or [out_total, 1]) beside the A/B pair
    pair_width: int = 0  # another kind's exact pair width (``kinds/``; 0: a LoRA, whose width is ``rank``)

    @property
    def keys(self) -> tuple[str, ...]:
        factors = tuple(key for _, key in self.factor_keys) or (self.down_key, self.up_key)
        return factors + tuple(k for k in (self.alpha_key, self.magnitude_key) if k)

    @property
    def peft_name(self) -> str:
        """The module name PEFT saw when it matched ``alpha_pattern``/``rank_pattern``: the stored stem without
        PEFT's save prefix ``base_model.model.``, or without diffusers' component prefix (``transformer.``,
        ``transformer_ref.``), which diffusers drops before injecting; other layouts: the prefix-stripped name."""
        if self.format == "kohya":
            return self.module
        for prefix in (PEFT_SAVE_PREFIX, *(f"{p}." for p in PARTITIONS)):
            if self.stem.startswith(prefix):
                return self.stem[len(prefix):]
        return self.module



@dataclass(frozen=True)
class AdapterPlan:
    """Where every key of an adapter file goes. ``modules`` are for the requested partition; ``reference_modules``
    are for ``transformer_ref`` and not applied (``partition="transformer"``); ``unmatched_keys`` matched nothing.
    ``parts``: the exact parts and head banks for the requested partition (``h3app.adapters.parts``);
    ``file_parts``: those of the whole file."""

    format: str
    suffix_style: str
    prefix: str
    modules: tuple[ModulePlan, ...]
    reference_modules: tuple[ModulePlan, ...]
    unmatched_keys: tuple[str, ...]
    warnings: tuple[str, ...]
    dtype: str
    parts: PartsPlan = PartsPlan()
    file_parts: PartsPlan = PartsPlan()


@dataclass(slots=True)
class _Stem:
    prefix: str
    file_partition: str
    flattened: bool
    stem: str  # as stored, prefix included
    name: str  # prefix stripped (dotted or flattened)
    down: str | None = None
    up: str | None = None
    alpha: str | None = None
    slots: frozenset[str] = frozenset()
    styles: frozenset[str] = frozenset()
    factors: dict[str, str] = field(default_factory=dict)  # another kind's factors (kinds/): factor name → key
    magnitude: str | None = None  # DoRA's magnitude (PEFT lora_magnitude_vector, kohya/LyCORIS dora_scale)


def _prefix_end(key: str) -> tuple[int, bool]:
    """Where ``key``'s wrapper prefix ends, and whether it ends in a flattened kohya prefix (``(0, False)``: none)."""
    if not key.startswith(_PREFIX_STARTS):
        return 0, False
    found = _PREFIX.match(key)
    assert found is not None, "every part of _PREFIX is optional: it matches at the start of any key"
    return found.end(), found.group("flattened") is not None


def strip_prefix(key: str) -> tuple[str, str, str]:
    """``(file partition, wrapper prefix, the rest)`` of a key or a key's stem."""
    start, _ = _prefix_end(key)
    partition = REFERENCE_PARTITION if start and "transformer_ref." in key[:start] else MAIN_PARTITION
    return partition, key[:start], key[start:]


def _collect_stems(name: str, keys: list[str]) -> tuple[dict[tuple[str, str], _Stem], list[str]]:
    """Group the keys by module stem (partition, prefix-stripped name): ``(stems, keys that parse as no factor)``."""
    stems: dict[tuple[str, str], _Stem] = {}
    unparsed: list[str] = []
    for key in keys:
        start, flattened = _prefix_end(key)
        parsed = _FACTOR.search(key, start + 1)
        stem_end = parsed.start() if parsed is not None else 0
        if parsed is None or "\n" in key[start:stem_end]:
            unparsed.append(key)
            continue
        ab, slot, du, is_alpha, kind, magnitude = parsed.group("ab", "slot", "du", "alpha", "kind", "magnitude")
        stem_name = key[start:stem_end]
        file_partition = REFERENCE_PARTITION if start and "transformer_ref." in key[:start] else MAIN_PARTITION
        stem_key = (file_partition, stem_name.replace(".", "_") if flattened else stem_name)
        entry = stems.get(stem_key)
        if entry is None:
            entry = stems[stem_key] = _Stem(key[:start], file_partition, flattened, key[:stem_end], stem_name)
        if kind:
            existing, role = entry.factors.get(kind), kind
            entry.factors.setdefault(kind, key)
        elif magnitude:
            existing, role = entry.magnitude, "DoRA magnitude"
            entry.magnitude = entry.magnitude or key
        elif is_alpha:
            existing, role = entry.alpha, "alpha"
            if existing is None:
                entry.alpha = key
        else:
            if ab:
                down, style = ab == "lora_A", SUFFIX_AB
            else:
                down, style = du == "lora_down", SUFFIX_DOWN_UP
            existing, role = (entry.down, "down") if down else (entry.up, "up")
            if existing is None:
                if down:
                    entry.down = key
                else:
                    entry.up = key
            if style not in entry.styles:
                entry.styles = entry.styles | {style}
        if existing is not None:
            raise H3AppError(
                f"{name}: keys {existing!r} and {key!r} both give the {role} factor of module {stem_name!r}: the file "
                "mixes two copies of one adapter; keep one."
            )
        if slot and slot not in entry.slots:
            entry.slots = entry.slots | {slot}

    return stems, unparsed


def plan_adapter(view: HeaderView, *, qkv_layout: str = "auto", partition: str = MAIN_PARTITION) -> AdapterPlan:
    """Map every key of ``view`` onto canonical targets, or raise ``H3AppError`` naming what was seen.

    ``qkv_layout`` ("auto" | "blocked" | "interleaved") overrides the row order of fused QKV modules ("auto":
    interleaved for DiffSynth, blocked otherwise). ``partition`` is the transformer the adapter is for:
    ``transformer_ref.``-prefixed keys go to ``reference_modules`` unless it is ``"transformer_ref"``.
    """
    if qkv_layout not in QKV_LAYOUTS:
        raise H3AppError(f"qkv_layout must be one of {', '.join(QKV_LAYOUTS)}, got {qkv_layout!r}.")
    if partition not in PARTITIONS:
        raise H3AppError(f"partition must be one of {', '.join(PARTITIONS)}, got {partition!r}.")
    name = view.name
    keys = list(view.tensors)
    if not keys:
        raise H3AppError(f"{name} holds no tensors: it is not an adapter.")
    refuse_families(name, keys)
    file_parts, lora_keys = plan_parts(view, keys, strip_prefix)

    stems, unparsed = _collect_stems(name, lora_keys)
    slots = sorted({slot for entry in stems.values() for slot in entry.slots})
    if len(slots) > 1:
        raise H3AppError(
            f"{name} holds several PEFT adapter slots ({', '.join(slots)}): save one adapter per file (PEFT's "
            "save_pretrained does that)."
        )
    found_rules = {key: match_name(entry.name, entry.flattened)
                   for key, entry in stems.items() if entry.down or entry.up or entry.factors}
    # Foreign-model names are looked for only among stems no H3 rule claimed (the common case: none).
    refuse_foreign(name, [entry.name for key, entry in stems.items() if found_rules.get(key) is None] + unparsed)
    if not found_rules and not file_parts:
        refuse_no_lora(name, keys, unparsed)

    plans, no_match, orphan_alphas, hybrid = _plan_modules(view, stems, found_rules, unparsed, qkv_layout)

    if not plans and not file_parts:
        raise H3AppError(
            f"{name}: none of its {len(keys)} keys names an H3 module (first keys: {', '.join(sorted(keys)[:3])})"
            f"{_architecture_hint(view.metadata)}: it is not a MiniMax-H3 LoRA, or uses a layout h3app does not know."
        )
    _refuse_duplicate_targets(name, plans)
    refuse_part_conflicts(name, file_parts, [(p.file_partition, t, p.stem) for p in plans for t in p.targets])
    plans.sort(key=lambda plan: natural_key(plan.targets[0]))
    warnings = _key_warnings(hybrid, no_match, orphan_alphas) + [w for w in (dense_warning(plans),) if w]
    applied, kept_apart, not_applied = _split_partitions(plans, partition, warnings)
    has_reference = any(p.file_partition == REFERENCE_PARTITION for p in plans) or bool(
        file_parts.only(REFERENCE_PARTITION))
    parts = file_parts.only(REFERENCE_PARTITION if partition == REFERENCE_PARTITION and has_reference
                            else MAIN_PARTITION)

    formats = Counter([p.format for p in plans] or ["peft"])  # a file of exact parts only: diffusers names
    if len(formats) > 1:
        warnings.append(f"the file mixes layouts ({', '.join(sorted(formats))}); each module is read by its own rule.")
    described = applied or plans
    dtypes = sorted({p.dtype for p in plans} | {p.dtype for p in parts.parts} | {b.dtype for b in parts.banks})
    return AdapterPlan(
        format=formats.most_common(1)[0][0],
        suffix_style=Counter([p.suffix_style for p in plans] or [SUFFIX_AB]).most_common(1)[0][0],
        prefix=Counter([p.prefix for p in described] or [""]).most_common(1)[0][0],
        modules=tuple(applied),
        reference_modules=tuple(kept_apart),
        unmatched_keys=tuple(sorted(set(no_match + orphan_alphas + not_applied))),
        warnings=tuple(warnings),
        dtype=dtypes[0] if len(dtypes) == 1 else "mixed(" + ",".join(dtypes) + ")",
        parts=parts,
        file_parts=file_parts,
    )


def _plan_modules(view: HeaderView, stems: dict[tuple[str, str], _Stem], found_rules: dict, unparsed: list[str],
                  qkv_layout: str) -> tuple[list[ModulePlan], list[str], list[str], list[str]]:
    """``(plans, keys matching no module, alpha keys without factors, hybrid flattened stems)``."""
    no_match: list[str] = list(unparsed)
    orphan_alphas: list[str] = []
    plans: list[ModulePlan] = []
    hybrid: list[str] = []
    for key, entry in stems.items():
        if not (entry.down or entry.up or entry.factors):
            orphan_alphas.extend(k for k in (entry.alpha, entry.magnitude) if k)
            continue
        found = found_rules[key]
        if found is None:
            no_match.extend(k for k in (entry.down, entry.up, entry.alpha, entry.magnitude, *entry.factors.values()) if k)
            continue
        alternative, groups, matched_flat = found
        if matched_flat and not entry.flattened:
            hybrid.append(entry.stem)
        plans.append(_module_plan(view, entry, alternative, groups, matched_flat, qkv_layout))
    return plans, no_match, orphan_alphas, hybrid


def _key_warnings(hybrid: list[str], no_match: list[str], orphan_alphas: list[str]) -> list[str]:
    warnings: list[str] = []
    if hybrid:
        warnings.append(
            f"{len(hybrid)} modules use hybrid flattened names (e.g. {hybrid[0]!r}); matched against the H3 vocabulary."
        )
    if no_match:
        warnings.append(f"{len(no_match)} keys match no H3 module and are not applied (e.g. {sorted(no_match)[0]!r}).")
    if orphan_alphas:
        warnings.append(
            f"{len(orphan_alphas)} alpha tensors have no LoRA factors beside them (e.g. {sorted(orphan_alphas)[0]!r}); "
            "not applied."
        )
    return warnings


def _split_partitions(plans: list[ModulePlan], partition: str,
                      warnings: list[str]) -> tuple[list[ModulePlan], list[ModulePlan], list[str]]:
    """``(applied, kept apart for transformer_ref, keys not applied)`` for the requested ``partition``; says in
    ``warnings`` what is not applied."""
    main = [p for p in plans if p.file_partition == MAIN_PARTITION]
    reference = [p for p in plans if p.file_partition == REFERENCE_PARTITION]
    not_applied: list[str] = []
    if partition == MAIN_PARTITION:
        applied, kept_apart = main, reference
        if reference:
            warnings.append(
                f"{len(reference)} modules ({sum(len(p.targets) for p in reference)} targets) are for the reference "
                "partition (transformer_ref), not applied: use the ref2va workflow to apply them."
            )
    elif reference:
        applied, kept_apart = reference, []
        if main:
            warnings.append(f"{len(main)} modules are for the main partition (transformer), not applied to transformer_ref.")
            not_applied = [k for p in main for k in p.keys]
    else:
        applied, kept_apart = main, []

    return applied, kept_apart, not_applied


@functools.lru_cache(maxsize=4096)
def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders block indices numerically (``blocks.2`` before ``blocks.10``)."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in _DIGIT_RUNS.split(name) if part)


_DIGIT_RUNS = re.compile(r"(\d+)")


def _architecture_hint(metadata: Mapping[str, str]) -> str:
    for entry in ("modelspec.architecture", "ss_base_model_version"):
        if metadata.get(entry):
            return f"; its metadata says {entry} = {metadata[entry]!r}"
    return ""


def _module_plan(
    view: HeaderView, entry: _Stem, alternative: Alternative, groups: tuple[str, ...], matched_flat: bool,
    qkv_layout: str,
) -> ModulePlan:
    """The plan of one module, its factors checked (``factor_checks.check_factors``, or its kind's: ``kinds/``)."""
    kind, factor_keys, alpha_applies, width = LORA_KIND, tuple(sorted(entry.factors.items())), True, 0
    if entry.factors:
        factors, kind, found = check_kind(view, entry, alternative.rule, matched_flat, alternative.family, qkv_layout)
        alpha_applies, width = found.alpha_applies, found.width
        entry.down, entry.up = factor_keys[0][1], factor_keys[-1][1]  # named in messages; ``keys`` lists them all
    if entry.down is None or entry.up is None:
        have, missing = ("lora_A/lora_down", "lora_B/lora_up") if entry.down else ("lora_B/lora_up", "lora_A/lora_down")
        raise H3AppError(f"{view.name}: module {entry.stem!r} has {have} but no {missing}: the file is incomplete; "
                         "re-export it.")
    if not entry.factors:
        factors = check_factors(view, entry, alternative, matched_flat, qkv_layout, view.tensors[entry.down],
                                view.tensors[entry.up])
        if entry.magnitude is not None:
            check_magnitude(view, entry.stem, entry.magnitude, factors)
    rule = alternative.rule
    return ModulePlan(
        stem=entry.stem,
        module=dotted_name(rule, groups) if matched_flat else entry.name,  # the name a flattened one stands for
        prefix=entry.prefix,
        format=factors.format,
        layout=rule.layout,
        qkv_order=factors.qkv_order,
        targets=tuple([target.format(*groups) for target in rule.targets]),
        target_shapes=factors.target_shapes,
        rank=factors.rank,
        down_key=entry.down,
        up_key=entry.up,
        alpha_key=entry.alpha,
        stacked=factors.stacked,
        file_partition=entry.file_partition,
        dtype=factors.dtype,
        suffix_style=factors.suffix_style,
        kind=kind,
        factor_keys=factor_keys,
        alpha_applies=alpha_applies,
        magnitude_key=entry.magnitude,
        pair_width=width,
    )


def _refuse_duplicate_targets(name: str, plans: Sequence[ModulePlan]) -> None:
    owner: dict[tuple[str, str], str] = {}
    for plan in plans:
        for target in plan.targets:
            key = (plan.file_partition, target)
            if key in owner:
                raise H3AppError(
                    f"{name}: target {target!r} is given twice, by {owner[key]!r} and {plan.stem!r}: the file mixes two "
                    "copies of one adapter; keep one."
                )
            owner[key] = plan.stem

