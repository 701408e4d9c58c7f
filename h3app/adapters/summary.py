"""What one adapter applied in one run, as one object, and the one way to say it.

:class:`AdapterSummary` holds, per group of modules (attention, feed-forward, …), the rank, the alpha, where that
alpha comes from, the effective scale and how many targets share them. It is built from the resolution the job ran
(:class:`~h3app.adapters.resolved.ResolvedAdapter`, or its JSON inside a run's provenance) and never recomputes an
alpha on its own. Every place that tells a person what a run applied — the result caption, the history label and
its differences, the settings JSON, the CLI's summary line and the "copy as CLI" snippets — formats it here (and
what a run left out of each file, :func:`not_applied_lines`):

- :func:`values_text`: one value as itself, several as their distinct set (``2 / 4``);
- :func:`alpha_text`: ``2 / 4 (adapter_config.json, rsLoRA)`` — the alphas, their sources and the rsLoRA rule;
- :func:`describe`: ``alpha 2 / 4 (adapter_config.json, rsLoRA) × scale 1 → effective 1 / 2``;
- :func:`per_group`: the JSON value — one number when every group agrees, else ``{group: number or [distinct
  numbers]}``, so two alphas of one group never collide into one.

Parts of an adapter that are not low-rank pairs (an exact delta, a bank of heads) can join as rows of their own
``kind``; a row without an alpha (``alpha`` None) is left out of the alpha words and kept in the scales.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePath
from typing import Any

from ..rules.alpha_source import TIERS, AlphaSource
from ..rules.scale import effective_scale
from ..settings import recorded
from .not_applied import NotApplied

LORA = "lora"  # a row of low-rank pairs (B·A at alpha / rank); other kinds name other parts of an adapter
RSLORA_WORD = "rsLoRA"


@dataclass(frozen=True)
class GroupRow:
    """The targets of one group that share a rank, an alpha (and its source) and a group strength: their
    ``scale`` = alpha × strength × group strength / rank (/ √rank for rsLoRA)."""

    group: str
    rank: int | None
    alpha: float | None
    alpha_source: AlphaSource | None
    scale: float | None
    targets: int = 0
    use_rslora: bool = False
    group_strength: float = 1.0
    kind: str = LORA

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "kind": self.kind, "rank": self.rank, "alpha": self.alpha,
                "alpha_source": None if self.alpha_source is None else str(self.alpha_source),
                "use_rslora": self.use_rslora, "group_strength": self.group_strength, "targets": self.targets,
                "effective_scale": self.scale}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroupRow:
        """A row from ``ResolvedAdapter.to_json()["groups"]`` (or this class's own JSON)."""
        source = data.get("alpha_source")
        return cls(group=str(data.get("group", "?")), rank=_int_or_none(data.get("rank")),
                   alpha=_float_or_none(data.get("alpha")), alpha_source=None if source is None else AlphaSource.of(source),
                   scale=_float_or_none(data.get("effective_scale", data.get("scale"))),
                   targets=int(data.get("targets") or data.get("count") or 0), use_rslora=bool(data.get("use_rslora")),
                   group_strength=float(data.get("group_strength", 1.0)), kind=str(data.get("kind") or LORA))


@dataclass(frozen=True)
class AdapterSummary:
    """One adapter in one run: its name, the strength (the Scale control), the override alpha (None: the file's
    chain), whether rsLoRA's √rank applies, and one :class:`GroupRow` per group, rank and alpha."""

    name: str
    strength: float
    override: float | None
    use_rslora: bool
    rows: tuple[GroupRow, ...]

    # ------------------------------------------------------------------------------------------------ building
    @classmethod
    def of(cls, resolved: Any, name: str = "") -> AdapterSummary:
        """From a :class:`~h3app.adapters.resolved.ResolvedAdapter` (the object the engine's scales equal)."""
        rows = tuple(GroupRow(g.group, g.rank, g.alpha, AlphaSource.of(g.alpha_source), g.scale, g.count,
                              g.use_rslora, g.group_strength) for g in resolved.groups)
        return cls(name, float(resolved.strength), resolved.override, bool(resolved.use_rslora), rows)

    @classmethod
    def from_json(cls, adapter: Mapping[str, Any]) -> AdapterSummary:
        """From a run's adapter JSON: a provenance (``AdapterBinding.provenance()``, with its ``resolved``), a
        ``ResolvedAdapter.to_json()``, or a bare entry of older settings that has only ``resolved_alpha`` and its
        source (then one row without rank or scale)."""
        nested = adapter.get("resolved")
        resolved: Mapping[str, Any] = nested if isinstance(nested, Mapping) else adapter
        name = file_stem(adapter)
        strength = float(adapter.get("strength", resolved.get("strength", 1.0)) or 0.0)
        override = _float_or_none(resolved["override"] if "override" in resolved else adapter.get("alpha"))
        groups = resolved.get("groups")
        if isinstance(groups, Sequence) and groups:
            rows = tuple(GroupRow.from_json(g) for g in groups)
            return cls(name, strength, override, bool(resolved.get("use_rslora")), rows)
        alpha = adapter.get("resolved_alpha", adapter.get("alpha"))
        source = adapter.get("resolved_alpha_source") or (AlphaSource.EXPLICIT if adapter.get("alpha") is not None
                                                          else adapter.get("alpha_source"))
        rows = tuple(GroupRow(str(group), _int_or_none(adapter.get("rank")), _float_or_none(value),
                              None if source is None else AlphaSource.of(source), None)
                     for group, value in _flat_alphas(alpha))
        return cls(name, strength, override, bool(adapter.get("use_rslora")), rows)

    def at(self, alpha: float | None, strength: float, *, rank_fallback: bool = False) -> AdapterSummary:
        """The same adapter at another setting, through the one scale formula: ``alpha`` (None: each row keeps the
        alpha it had) and ``strength``; ``rank_fallback``: the old loaders' alpha = rank without rsLoRA at scale 1
        (the equivalence check's third column)."""
        rows = []
        used: float | None
        source: AlphaSource | None
        for row in self.rows:
            if row.rank is None or row.kind != LORA:
                rows.append(row)
                continue
            if rank_fallback:
                used, source, rslora = float(row.rank), AlphaSource.RANK_FALLBACK, False
            elif alpha is not None:
                used, source, rslora = float(alpha), AlphaSource.EXPLICIT, row.use_rslora
            else:
                used, source, rslora = row.alpha, row.alpha_source, row.use_rslora
            scale = None if used is None else effective_scale(used, strength, row.rank, rslora, row.group_strength)
            rows.append(replace(row, alpha=used, alpha_source=source, use_rslora=rslora, scale=scale))
        override = None if rank_fallback else alpha
        return replace(self, strength=float(strength), override=override, rows=_merged(rows),
                       use_rslora=False if rank_fallback else self.use_rslora)

    # --------------------------------------------------------------------------------------------- the facts
    @property
    def alphas(self) -> tuple[float, ...]:
        """Every distinct alpha the run applied, ascending."""
        return tuple(sorted({r.alpha for r in self.rows if r.alpha is not None}))

    @property
    def scales(self) -> tuple[float, ...]:
        """Every distinct effective scale the run applied, ascending (empty when the entry records none)."""
        return tuple(sorted({r.scale for r in self.rows if r.scale is not None}))

    @property
    def alpha_sources(self) -> tuple[AlphaSource, ...]:
        """The sources of those alphas, in the alpha chain's order."""
        found = {r.alpha_source for r in self.rows if r.alpha_source is not None and r.alpha is not None}
        return tuple(s for s in (*TIERS, AlphaSource.MIXED) if s in found)

    @property
    def resolved_alpha(self) -> float | dict[str, Any] | None:
        """The alpha as JSON: one number, or per group (:func:`per_group`)."""
        return per_group(self.rows, "alpha")

    @property
    def effective_scale(self) -> float | dict[str, Any] | None:
        """The effective scale as JSON: one number, or per group (:func:`per_group`)."""
        return per_group(self.rows, "scale")

    @property
    def relies_on_rank_fallback(self) -> bool:
        return AlphaSource.RANK_FALLBACK in self.alpha_sources

    def to_json(self) -> dict[str, Any]:
        """The summary as the settings JSON carries it (``text`` is :func:`describe`)."""
        return {"name": self.name, "resolved_alpha": self.resolved_alpha,
                "alpha_sources": [str(s) for s in self.alpha_sources], "alphas": list(self.alphas),
                "strength": self.strength, "override": self.override, "use_rslora": self.use_rslora,
                "effective_scale": self.effective_scale, "effective_scales": list(self.scales),
                "groups": [r.to_json() for r in self.rows], "text": describe(self)}


# ---------------------------------------------------------------------------------------------------- formatting
def number(value: Any) -> str:
    """``8.0`` → ``8``, ``0.0625`` → ``0.0625`` (6 significant digits); None → ``auto``."""
    if value is None:
        return "auto"
    try:
        return f"{float(value):.6g}"
    except (TypeError, ValueError):
        return str(value)


def values_text(values: Iterable[float]) -> str:
    """One value as itself, several as their distinct set: ``2 / 4``; none: ``—``."""
    distinct = sorted(set(values))
    return " / ".join(number(v) for v in distinct) if distinct else "—"


def alpha_text(summary: AdapterSummary) -> str:
    """``1 (registry)``, ``16 (rank fallback)``, ``2 / 4 (adapter_config.json, rsLoRA)``, ``8 (typed)``."""
    words = [s.word for s in summary.alpha_sources]
    if summary.use_rslora:
        words.append(RSLORA_WORD)
    value = values_text(summary.alphas) if summary.alphas else number(summary.override)
    return f"{value} ({', '.join(words)})" if words else value


def scale_words(summary: AdapterSummary) -> str:
    """The effective scale(s): ``0.0625``, ``1 / 2``; ``—`` when the entry records none."""
    return values_text(summary.scales)


def describe(summary: AdapterSummary) -> str:
    """``alpha 2 / 4 (adapter_config.json, rsLoRA) × scale 1 → effective 1 / 2``."""
    effective = f" → effective {scale_words(summary)}" if summary.scales else ""
    return f"alpha {alpha_text(summary)} × scale {number(summary.strength)}{effective}"


def label(summary: AdapterSummary) -> str:
    """A history label's adapter part: ``tiny_turbo_4step α 1 (registry) × 1``."""
    return f"{summary.name} α {alpha_text(summary)} × {number(summary.strength)}"


def per_group(rows: Iterable[Any], attribute: str) -> float | dict[str, Any] | None:
    """``attribute`` ("alpha" or "scale") of ``rows`` (``GroupRow`` or ``resolved.GroupScale``) as JSON: one
    number when every row agrees; else ``{group: number}`` for groups whose rows agree and ``{group: [distinct
    numbers]}`` for groups whose rows differ; None when no row has one."""
    by_group: dict[str, list[float]] = {}
    for row in rows:
        value = getattr(row, attribute)
        if value is not None:
            by_group.setdefault(row.group, []).append(float(value))
    every = {v for values in by_group.values() for v in values}
    if not every:
        return None
    if len(every) == 1:
        return every.pop()
    return {group: (values[0] if len(set(values)) == 1 else sorted(set(values)))
            for group, values in by_group.items()}


def file_stem(adapter: Mapping[str, Any]) -> str:
    """The adapter's file name without folder and suffix (``tiny_turbo_4step``; a PEFT folder by its name)."""
    name = adapter.get("weight_name") or adapter.get("source") or adapter.get("name") or "?"
    stem = PurePath(str(name)).stem
    if stem == "adapter_model" and adapter.get("source"):
        stem = PurePath(str(adapter["source"])).name or stem
    return stem or str(name)


def summaries(adapters: Iterable[Mapping[str, Any]]) -> list[AdapterSummary]:
    """The summary of each adapter of a run's settings JSON."""
    return [AdapterSummary.from_json(a) for a in adapters]


def applied_lines(adapters: Iterable[Mapping[str, Any]]) -> list[str]:
    """``["tiny_turbo_4step: alpha 1 (registry) × scale 1 → effective 0.0625", …]``: the settings JSON's and
    ``generate --json``'s ``applied`` field, one line per adapter of the run (with its advanced strengths)."""
    return [f"{AdapterSummary.from_json(a).name}: {applied_words(a)}" for a in adapters]


def applied_words(adapter: Mapping[str, Any]) -> str:
    """Everything one adapter of a run applied, in one line: :func:`describe`, its advanced strengths and its parts
    beyond A/B pairs (``alpha 1 (registry) × scale 1 → effective 0.0625; audio ×0, schedule linear:1:0.5; exact
    parts: Δ 85 at the strength``) — the settings JSON's ``applied`` and the UI's result caption."""
    return f"{describe(AdapterSummary.from_json(adapter))}{advanced_words(adapter)}{parts_words(adapter)}"


def not_applied_lines(adapters: Iterable[Mapping[str, Any]]) -> list[str]:
    """``["kohya_te: 24 keys not applied: 24 text-encoder keys (…): lora_te_…, …"]``: one line per adapter of a
    run's settings JSON that left keys of its file out (``adapters/not_applied.py``); empty when all applied. The
    ``not_applied`` field of ``generate --json``, ``check --json`` and ``grid --json``, and the lines under their
    summary."""
    adapters = list(adapters)
    texts = [NotApplied.from_json(a.get("not_applied")).text() for a in adapters]
    return [f"{file_stem(a)}: {text}" for a, text in zip(adapters, texts) if text]


def advanced_words(adapter: Mapping[str, Any]) -> str:
    """``"; audio ×0, schedule linear:1:0.5, blocks 0-9:0.5"``: the advanced strengths a run's adapter JSON sets
    (docs/lora-engine.md), "" when it sets none."""
    words = [knob.short(value) for knob, value in recorded(adapter).items() if knob.is_set(value)]
    return "; " + ", ".join(words) if words else ""


def parts_words(adapter: Mapping[str, Any]) -> str:
    """``"; exact parts: Δ 85 at the strength, 2 replacements, head bank of 32; left out: adaln 12"``: what a run's
    adapter JSON applied beyond A/B pairs (its ``parts`` counts, ``adapters/parts.py``'s kinds) and the parts left
    out on request (``skipped_parts``); "" when it has only pairs."""
    parts = adapter.get("parts") or {}
    deltas = int(parts.get("diff", 0) or 0) + int(parts.get("diff_b", 0) or 0)
    replaced = int(parts.get("set_weight", 0) or 0) + int(parts.get("set_bias", 0) or 0)
    bank = int(parts.get("head_bank", 0) or 0)
    words = [f"Δ {deltas} at the strength" if deltas else "",
             f"{replaced} replacement{'' if replaced == 1 else 's'}" if replaced else "",
             f"head bank of {bank}" if bank else ""]
    text = f"; exact parts: {', '.join(w for w in words if w)}" if any(words) else ""
    skipped = {kind: n for kind, n in (adapter.get("skipped_parts") or {}).items() if n}
    if skipped:
        text += "; left out: " + ", ".join(f"{kind} {n}" for kind, n in skipped.items())
    return text


# ------------------------------------------------------------------------------------------------------- helpers
def _merged(rows: Sequence[GroupRow]) -> tuple[GroupRow, ...]:
    """Rows that became equal (a typed alpha makes one group's alphas one) merged, their targets added."""
    merged: dict[tuple, GroupRow] = {}
    for row in rows:
        key = (row.group, row.kind, row.rank, row.alpha, row.alpha_source, row.group_strength, row.use_rslora)
        merged[key] = replace(row, targets=merged[key].targets + row.targets) if key in merged else row
    return tuple(merged.values())


def _flat_alphas(alpha: Any) -> list[tuple[str, Any]]:
    """Older entries: one alpha, or a per-rank/per-group mapping (values may be lists of distinct values)."""
    if isinstance(alpha, Mapping):
        return [(str(k), v) for k, values in alpha.items() for v in (values if isinstance(values, list) else [values])]
    return [("all", alpha)]


def _float_or_none(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _int_or_none(value: Any) -> int | None:
    number_ = _float_or_none(value)
    return None if number_ is None else int(number_)
