"""The resolved adapter: what one adapter runs at, computed once from its facts and the person's settings.

``resolve_adapter(info, alpha, strength, group_strengths)`` is the one place that turns

- the file's facts (an ``AdapterInfo``: every target's rank and alpha-chain value with its source, rsLoRA, the
  registry entry found by ``known.registry_identity`` — one rule for every kind of source),
- and the person's settings (override alpha or None, strength, group strengths)

into a :class:`ResolvedAdapter`: the alpha per module and its source (one ``AlphaSource``), the effective scale per
group of modules, and the warnings measured against the adapter's own facts. Inspect's readout, Load, every job's
provenance (generate, check, grid, history, the snippets, ``--json``, the API) show this object; the engine applies
the same alphas through the same formula (``rules.scale``), and a test holds the two equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..rules.alpha_source import AlphaSource
from ..rules.h3_modules import group_of
from ..rules.scale import DORA_STRENGTH_RULE, effective_scale
from ..rules.values import parse_strength
from ..settings import check_alpha, check_strength
from .summary import per_group

FAR = 4.0  # an effective scale more than FAR× (or less than 1/FAR×) the one the adapter's facts imply is flagged


@dataclass(frozen=True)
class GroupScale:
    """Targets of one group (attention, feed_forward, …) that share a rank and an alpha: ``scale`` =
    alpha × strength × group strength / rank (/ √rank for rsLoRA), float64; ``expected`` is the scale the adapter's
    own facts imply (chain alpha at the registry's suggested strength, else 1), None when nothing is stored."""

    group: str
    rank: int
    alpha: float
    alpha_source: AlphaSource
    use_rslora: bool
    strength: float
    group_strength: float
    count: int
    scale: float
    expected: float | None

    @property
    def formula(self) -> str:
        divisor = f"√{self.rank}" if self.use_rslora else f"{self.rank}"
        factor = f" × {self.group_strength:g}" if self.group_strength != 1.0 else ""
        return f"{self.strength:g}{factor} × {self.alpha:g} / {divisor}"

    @property
    def rank_fallback_ratio(self) -> float:
        """How many times stronger the old "alpha = rank" convention would be than this alpha (same strength)."""
        return self.rank / self.alpha if self.alpha else float("inf")

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "rank": self.rank, "alpha": self.alpha, "alpha_source": str(self.alpha_source),
                "use_rslora": self.use_rslora, "strength": self.strength, "group_strength": self.group_strength,
                "targets": self.count, "effective_scale": self.scale, "expected_scale": self.expected}


@dataclass(frozen=True)
class ResolvedAdapter:
    """One adapter at one setting. ``alphas``/``alpha_sources``: per canonical target, the alpha in use and where it
    comes from; ``alpha``/``alpha_source`` their common value (None / ``mixed`` when they differ);
    ``stored_alpha``/``stored_source`` what the chain alone gives (before an override); ``groups`` the effective
    scales; ``effective_scale`` and ``resolved_alpha`` one number when every module agrees, else per group
    (``{"attention": 2.0, "feed_forward": [1.0, 2.0]}``: a group's distinct values never collide); ``warnings``
    what is far from the adapter's own facts."""

    alphas: Mapping[str, float]
    alpha_sources: Mapping[str, AlphaSource]
    alpha: float | None
    alpha_source: AlphaSource
    stored_alpha: float | None
    stored_source: AlphaSource
    override: float | None
    strength: float
    group_strengths: Mapping[str, float]
    use_rslora: bool
    groups: tuple[GroupScale, ...]
    warnings: tuple[str, ...] = ()
    scales: Mapping[str, float] = field(default_factory=dict)

    @property
    def effective_scale(self) -> float | dict[str, Any] | None:
        """One number when every module runs at the same scale, else per group (``summary.per_group``)."""
        return per_group(self.groups, "scale")

    @property
    def resolved_alpha(self) -> float | dict[str, Any] | None:
        """The alpha in use: one number, or per group when modules differ (``summary.per_group``)."""
        return per_group(self.groups, "alpha")

    @property
    def relies_on_rank_fallback(self) -> bool:
        """Some module runs at the "alpha = rank" guess (nothing stored anywhere, no override)."""
        return AlphaSource.RANK_FALLBACK in set(self.alpha_sources.values())

    def to_json(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "alpha_source": str(self.alpha_source), "resolved_alpha": self.resolved_alpha,
                "stored_alpha": self.stored_alpha, "stored_source": str(self.stored_source),
                "override": self.override, "strength": self.strength,
                "group_strengths": dict(self.group_strengths), "use_rslora": self.use_rslora,
                "effective_scale": self.effective_scale, "groups": [g.to_json() for g in self.groups],
                "warnings": list(self.warnings)}


def resolve_adapter(info: Any, alpha: float | None = None, strength: float = 1.0,
                    group_strengths: Mapping[str, float] | None = None) -> ResolvedAdapter:
    """``info`` (an ``AdapterInfo`` or its ``to_json()``) at ``alpha`` (None: the chain's value per module),
    ``strength`` and ``group_strengths``. ``H3AppError`` for an alpha or strength the engine would refuse."""
    facts = info.to_json() if hasattr(info, "to_json") else dict(info)
    override = check_alpha(alpha)  # text is parsed here, a typed alpha (a job's settings) only range-checked
    strength = check_strength(strength)
    group_strengths = {g: parse_strength(v, f"strength of group {g!r}") for g, v in (group_strengths or {}).items()}
    ranks: Mapping[str, int] = facts.get("ranks") or {}
    stored: Mapping[str, float] = facts.get("alphas") or {}
    stored_sources = {t: AlphaSource.of(s) for t, s in (facts.get("alpha_sources") or {}).items()}
    rslora = bool(facts.get("use_rslora"))
    known = facts.get("known") or {}
    suggested = float(known["scale"]) if known.get("scale") is not None else 1.0

    alphas, sources, scales = {}, {}, {}
    counts: dict[tuple, int] = {}
    for target, rank in ranks.items():
        chain_source = stored_sources.get(target, AlphaSource.RANK_FALLBACK)
        chain_alpha = float(stored.get(target, rank))
        used, source = (override, AlphaSource.EXPLICIT) if override is not None else (chain_alpha, chain_source)
        group = group_of(target)
        factor = group_strengths.get(group, 1.0)
        scale = effective_scale(used, strength, int(rank), rslora, factor)
        expected = (None if chain_source == AlphaSource.RANK_FALLBACK
                    else effective_scale(chain_alpha, suggested, int(rank), rslora))
        alphas[target], sources[target], scales[target] = used, source, scale
        key = (group, int(rank), used, source, factor, expected)
        counts[key] = counts.get(key, 0) + 1
    groups = tuple(GroupScale(group, rank, used, source, rslora, strength, factor, count,
                              effective_scale(used, strength, rank, rslora, factor), expected)
                   for (group, rank, used, source, factor, expected), count
                   in sorted(counts.items(), key=lambda kv: (kv[0][0], -kv[0][1], kv[0][2])))
    values = set(alphas.values())
    source_set = set(sources.values())
    stored_values = {float(stored.get(t, r)) for t, r in ranks.items()}
    stored_set = {stored_sources.get(t, AlphaSource.RANK_FALLBACK) for t in ranks}
    return ResolvedAdapter(
        alphas=alphas, alpha_sources=sources,
        alpha=next(iter(values)) if len(values) == 1 else None,
        alpha_source=next(iter(source_set)) if len(source_set) == 1 else AlphaSource.MIXED,
        stored_alpha=next(iter(stored_values)) if len(stored_values) == 1 else None,
        stored_source=next(iter(stored_set)) if len(stored_set) == 1 else AlphaSource.MIXED,
        override=override, strength=strength, group_strengths=group_strengths, use_rslora=rslora, groups=groups,
        warnings=_far_warnings(groups, suggested, bool(known)) + _kind_warnings(facts), scales=scales)


def _kind_warnings(facts: Mapping[str, Any]) -> tuple[str, ...]:
    """What strength means for an adapter kind whose strength 0 is not the base (DoRA), said beside the strength."""
    return (DORA_STRENGTH_RULE,) if (facts.get("parts") or {}).get("dora") else ()


def _far_warnings(groups: tuple[GroupScale, ...], suggested: float, known: bool) -> tuple[str, ...]:
    """One warning when the strongest (or weakest) group runs far from what the adapter's own facts imply —
    whichever knob (override alpha, strength, group strength) moved it there."""
    measured = [(abs(g.scale) / g.expected, g.expected, g) for g in groups if g.expected and g.scale != 0]
    if not measured:
        return ()
    ratio, expected, group = max(measured, key=lambda item: item[0])
    low_ratio, low_expected, low_group = min(measured, key=lambda item: item[0])
    at = f"the registry's scale {suggested:g}" if known and suggested != 1.0 else "scale 1"
    if ratio > FAR:
        return (f"effective scale {_num(group.scale)} ({group.group.replace('_', '-')}, rank {group.rank}) is "
                f"{_num(ratio)}× the {_num(expected)} this adapter's own alpha gives at {at}: expect a "
                f"broken, over-driven result; lower the alpha or the scale.",)
    if low_ratio < 1 / FAR:
        return (f"effective scale {_num(low_group.scale)} ({low_group.group.replace('_', '-')}, rank "
                f"{low_group.rank}) is 1/{_num(1 / low_ratio)} of the {_num(low_expected)} this adapter's own "
                f"alpha gives at {at}: the adapter will barely show; raise the alpha or the scale.",)
    return ()


def _num(value: float) -> str:
    return f"{value:.3g}"
