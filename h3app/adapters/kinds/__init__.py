"""Adapter kinds beyond plain A/B pairs, one module each: what the kind's factor keys are called, the checks on
their shapes from the header alone, and the exact A/B pair its factors make. The planner (``formats.py``) and the
normaliser read every kind through :data:`KINDS`; adding a kind is one module here plus its tests and its doc line
(docs/adapters.md, "Adding an adapter kind")."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from ...errors import H3AppError
from ...rules.module_rules import FUSED_QKV, SWIGLU_GATE_UP, ModuleRule
from ..factor_checks import FactorFacts, StemFacts, check_alpha
from ..layouts import layout_of, qkv_order
from ..types import HeaderView
from . import loha, lokr
from .base import Kind, KindFacts

KINDS: tuple[Kind, ...] = (lokr.KIND, loha.KIND)
BY_NAME = {kind.name: kind for kind in KINDS}
# A key's factor name, for every kind: one alternation, a named group per kind.
FACTOR_NAMES = "|".join(f"(?P<{kind.name}>{kind.factors})" for kind in KINDS)
_ONE = re.compile(FACTOR_NAMES)


def kind_of(factor: str) -> Kind:
    """The kind a factor name (``lokr_w1_a``) belongs to."""
    found = _ONE.fullmatch(factor)
    assert found is not None and found.lastgroup is not None, f"{factor!r} is no kind's factor"
    return BY_NAME[found.lastgroup]


def check_kind(view: HeaderView, entry: StemFacts, rule: ModuleRule, matched_flat: bool,
               family: str, qkv_layout: str = "auto") -> tuple[FactorFacts, str, KindFacts]:
    """``(the module's factor facts, its kind's name, the kind's facts)`` for a module whose keys are another
    kind's factors: one kind per module, its factors checked by the kind, the rows its product makes split as the
    module's rule says (thirds of a fused QKV, halves of a SwiGLU ``fc1``)."""
    kinds = {kind_of(factor) for factor in entry.factors}
    kind = next(iter(kinds))
    if entry.magnitude is not None:
        raise H3AppError(f"{view.name}: {kind.label} module {entry.stem!r} carries a DoRA magnitude "
                         f"({entry.magnitude!r}): h3app applies DoRA on A/B pairs only; use a DoRA LoRA or a plain "
                         f"{kind.name}.")
    if len(kinds) > 1 or entry.down or entry.up:
        seen = sorted({k.label for k in kinds} | ({"LoRA"} if entry.down or entry.up else set()))
        raise H3AppError(f"{view.name}: module {entry.stem!r} holds factors of {' and '.join(seen)} at once: the "
                         "file mixes two adapters on one module; keep one.")
    found = kind.facts(view.name, entry.stem, {f: view.tensors[k] for f, k in entry.factors.items()})
    if entry.alpha is not None:
        check_alpha(view, entry.alpha)
    out_features, in_features = found.shape
    parts = 3 if rule.layout == FUSED_QKV else 2 if rule.layout == SWIGLU_GATE_UP else 1
    if out_features % parts:
        raise H3AppError(f"{view.name}: {kind.label} module {entry.stem!r} makes {out_features} rows, not divisible "
                         f"by {parts}: it does not fit the fused H3 layer it names; the file is not for this model.")
    rows = out_features // 3 if rule.layout == FUSED_QKV else out_features
    layout = layout_of(matched_flat, family, bool(entry.slots))
    facts = FactorFacts(format=layout.name, stacked=False, rank=found.rank,
                        target_shapes=((rows, in_features),) * len(rule.targets),
                        qkv_order=qkv_order(layout, qkv_layout) if rule.layout == FUSED_QKV else "", dtype=found.dtype,
                        suffix_style=kind.name)
    return facts, kind.name, found


def dense_warning(modules: Iterable[Any]) -> str | None:
    """A warning for the planned ``modules`` (``formats.ModulePlan``) whose exact pair is as wide as their layer (a
    LoKr with both factors whole, typically ai-toolkit's ``lokr_full_rank``): each is held as its dense ΔW, which
    costs as much memory as a full-rank LoRA; None when there are none."""
    dense = [m for m in modules if m.pair_width and m.pair_width >= min(
        sum(out for out, _ in m.target_shapes), m.target_shapes[0][1])]
    if not dense:
        return None
    values = sum(m.pair_width * (sum(out for out, _ in m.target_shapes) + m.target_shapes[0][1]) for m in dense)
    return (f"{len(dense)} {'/'.join(sorted({m.kind for m in dense}))} modules are full-rank (e.g. {dense[0].stem!r}): "
            f"each is held as its dense ΔW, {values / 1e6:.3g} M factor values in all ({4 * values / 2**30:.3g} GiB "
            "in fp32, half that on a bf16 GPU), as a full-rank LoRA would be; exact, but heavy at full size.")


def kind_counts(modules: Iterable[Any]) -> dict[str, int]:
    """Modules of each kind beyond plain LoRA among planned ``modules`` (``formats.ModulePlan``): their ``kind``, and
    ``dora`` for pairs with a DoRA magnitude (``inspect --json``'s ``parts``)."""
    counts: Counter[str] = Counter()
    for module in modules:
        if module.kind in BY_NAME:
            counts[module.kind] += 1
        if module.magnitude_key is not None:
            counts["dora"] += 1
    return dict(counts)


__all__ = ["BY_NAME", "FACTOR_NAMES", "check_kind", "dense_warning", "kind_counts", "KINDS", "Kind", "KindFacts", "kind_of"]
