"""The keys of an adapter file that a run does not apply, grouped by why: one object, read by every surface.

Inspection builds a :class:`NotApplied` from the key plan (``inspect._analyse``); it travels in ``AdapterInfo`` (JSON
``not_applied``), in every run's adapter provenance (``AdapterBinding.provenance``), and is said by
:func:`NotApplied.text` in ``inspect``, ``generate`` (plain and ``--json``), ``check``, ``grid``, the page's result
and the API. Why a key is not applied, in order of the rules (docs/adapters.md, "Keys not applied"):

- ``text_encoder``: a text encoder's LoRA (kohya ``lora_te_``/``lora_te1_``/``lora_te2_``, diffusers
  ``text_encoder.``/``text_encoder_2.``, …): h3app adapts the transformer only;
- ``other_model``: keys for the other transformer of the repo (``transformer_ref``, the ref2va workflow's DiT, while
  the run uses ``transformer``; or the other way round);
- ``no_factors``: an ``.alpha`` with no LoRA factors beside it;
- ``unknown_module``: everything else: the module names no H3 module.

A file none of whose keys applies is refused at Load (``normalise.load_adapter``, ``lora.validation``), never run.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..rules.choices import MAIN_PARTITION, REF2VA, REFERENCE_PARTITION
from .partition import runs_on

TEXT_ENCODER = "text_encoder"
OTHER_MODEL = "other_model"
NO_FACTORS = "no_factors"
UNKNOWN_MODULE = "unknown_module"
REASONS = (TEXT_ENCODER, OTHER_MODEL, NO_FACTORS, UNKNOWN_MODULE)

LISTED = 64  # keys per reason a JSON answer lists (its count is always exact)
SHOWN = 3  # keys per reason a line of text names

# A text encoder's LoRA keys: kohya's flattened ``lora_te[N]_``, diffusers' and PEFT's component names, SD's
# ``cond_stage_model.``/``conditioner.``; after PEFT's save prefix at most.
_TEXT_ENCODER = re.compile(
    r"^(?:base_model\.model\.)?(?:lora_te\d?_|text_encoders?(?:_\d)?[._]|te\d?\.|cond_stage_model\.|conditioner\.)")

_WHY = {
    TEXT_ENCODER: "text-encoder keys (h3app adapts the transformer only)",
    NO_FACTORS: "alpha tensors without LoRA factors",
    UNKNOWN_MODULE: "keys that name no H3 module",
}


def is_text_encoder_key(key: str) -> bool:
    return _TEXT_ENCODER.match(key) is not None


def other_model_why(partition: str) -> str:
    """Why keys for the transformer other than ``partition`` are not applied to it."""
    other_is_reference = partition != REFERENCE_PARTITION
    return f"keys for the other transformer, which {runs_on(REF2VA if other_is_reference else None)} runs"


@dataclass(frozen=True)
class SkippedKeys:
    """Keys not applied for one ``reason`` (one of ``REASONS``); ``count`` is exact, ``keys`` the first ones
    (sorted), ``why`` the words a person reads."""

    reason: str
    why: str
    count: int
    keys: tuple[str, ...]

    def text(self) -> str:
        """``24 text-encoder keys (h3app adapts the transformer only): lora_te_…, lora_te_…, …``."""
        more = ", …" if self.count > SHOWN else ""
        return f"{self.count} {self.why}: {', '.join(self.keys[:SHOWN])}{more}"

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "why": self.why, "count": self.count, "keys": list(self.keys[:LISTED])}


@dataclass(frozen=True)
class NotApplied:
    """Every key of a file a run leaves out, by reason (in ``REASONS`` order); empty when all apply."""

    groups: tuple[SkippedKeys, ...] = ()

    @property
    def count(self) -> int:
        return sum(g.count for g in self.groups)

    def __bool__(self) -> bool:
        return bool(self.groups)

    def text(self) -> str:
        """``24 keys not applied: 24 text-encoder keys (…): a, b, c, …``; "" when every key applies."""
        if not self.groups:
            return ""
        return f"{self.count} keys not applied: " + "; ".join(g.text() for g in self.groups)

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "reasons": [g.to_json() for g in self.groups], "text": self.text()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> NotApplied:
        """From :meth:`to_json` (None or ``{}``: nothing left out, as older settings record it)."""
        groups = tuple(SkippedKeys(str(g.get("reason", UNKNOWN_MODULE)), str(g.get("why", "")),
                                   int(g.get("count", len(g.get("keys") or ()))), tuple(g.get("keys") or ()))
                       for g in (data or {}).get("reasons") or ())
        return cls(groups)


def classify(keys: Iterable[str], *, other_model: Collection[str] = (), partition: str = MAIN_PARTITION) -> NotApplied:
    """``keys`` a plan left out, grouped by why: a text encoder's, ``other_model`` (keys of the other
    transformer's modules), an ``.alpha`` alone (``no_factors``: the plan names them so), else an unknown module."""
    ordered = sorted(set(keys))
    found: dict[str, list[str]] = {}
    for key in ordered:
        if is_text_encoder_key(key):
            reason = TEXT_ENCODER
        elif key in other_model:
            reason = OTHER_MODEL
        elif key.endswith(".alpha") and _alone(key, ordered):
            reason = NO_FACTORS
        else:
            reason = UNKNOWN_MODULE
        found.setdefault(reason, []).append(key)
    why = {**_WHY, OTHER_MODEL: other_model_why(partition)}
    return NotApplied(tuple(SkippedKeys(r, why[r], len(found[r]), tuple(found[r][:LISTED]))
                            for r in REASONS if r in found))


def _alone(alpha_key: str, ordered: list[str]) -> bool:
    """An ``.alpha`` key of sorted ``ordered`` with no other left-out key of its module (the keys that start with its
    stem sort together from where the stem would be)."""
    stem = alpha_key[: -len("alpha")]
    at = bisect.bisect_left(ordered, stem)
    return [k for k in ordered[at:at + 2] if k.startswith(stem)] == [alpha_key]
