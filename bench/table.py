"""One result row (ours vs a peer, the ratio, the goal, met or not) and the markdown table of all rows."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Goal:
    """A row's goal: ``ratio ≤ max_ratio`` and/or ``ours ≤ max_seconds`` (and ``ratio ≥ min_ratio``: a prediction
    over a measurement, wrong both ways); ``text`` is what the table shows."""

    text: str
    max_ratio: float | None = None
    max_seconds: float | None = None
    min_ratio: float | None = None

    def met(self, ours_s: float, ratio: float | None) -> bool | None:
        """True/False, or None when the goal needs a ratio that could not be measured (peer missing)."""
        checks: list[bool] = []
        if self.max_seconds is not None:
            checks.append(ours_s <= self.max_seconds)
        if self.max_ratio is not None or self.min_ratio is not None:
            if ratio is None:
                return None
            checks.append(ratio <= (self.max_ratio if self.max_ratio is not None else math.inf))
            checks.append(ratio >= (self.min_ratio or 0.0))
        return all(checks) if checks else None


@dataclass(frozen=True)
class Row:
    """One measured comparison, times in seconds; ``peer_s`` is None when the peer could not run. ``statistic``
    says which run of each side the times are: the median of the interleaved rounds, or "best of N" (the least
    disturbed round, for wall-clock rows that swing with the machine's other load)."""

    case: str
    what: str
    ours_s: float
    peer: str
    peer_s: float | None
    goal: Goal
    note: str = ""
    clock: str = "wall"
    extra: dict[str, Any] = field(default_factory=dict)
    statistic: str = "median"

    @property
    def ratio(self) -> float | None:
        if self.peer_s is None or self.peer_s <= 0:
            return None
        return self.ours_s / self.peer_s

    @property
    def met(self) -> bool | None:
        return self.goal.met(self.ours_s, self.ratio)

    def to_json(self) -> dict[str, Any]:
        return {"case": self.case, "what": self.what, "ours_s": self.ours_s, "peer": self.peer,
                "peer_s": self.peer_s, "ratio": self.ratio, "goal": self.goal.text, "met": self.met,
                "note": self.note, "clock": self.clock, "statistic": self.statistic,
                **({"extra": self.extra} if self.extra else {})}


def format_seconds(seconds: float | None) -> str:
    """``12.3 µs`` / ``4.56 ms`` / ``1.23 s``; ``—`` for None."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def format_ratio(ratio: float | None) -> str:
    """``0.0021×`` (= 1/476) below 0.1, ``1.03×`` otherwise; ``—`` for None."""
    if ratio is None:
        return "—"
    if ratio < 0.1:
        return f"{ratio:.2g}× (1/{1 / ratio:,.0f})" if ratio > 0 else "0×"
    return f"{ratio:.2f}×"


def _verdict(met: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "n/a"}[met]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(rows: Iterable[Row]) -> str:
    """The results as a GitHub markdown table (one line per row)."""
    lines = ["| case | what | ours | peer | peer time | ratio | goal | met? | measured | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        cells = (row.case, row.what, format_seconds(row.ours_s), row.peer, format_seconds(row.peer_s),
                 format_ratio(row.ratio), row.goal.text, _verdict(row.met), f"{row.clock}, {row.statistic}", row.note)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)
