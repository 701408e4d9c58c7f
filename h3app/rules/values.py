"""One parser per kind of user-given value: numbers, alphas, strengths and comma-separated lists.

Every entry point (CLI flags, ``--adapter-spec``, UI boxes, API JSON, settings files) parses through these, so a
value is accepted or refused with the same one-line message wherever it is typed.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import H3AppError

MAX_ALPHA = 1e6  # alpha × strength / rank beyond this only overflows the model
MAX_STRENGTH = 100.0
AUTO_WORDS = ("", "auto", "none", "null")


def parse_number(value: Any, what: str) -> float:
    """A finite float from a number or a numeric string; bools and anything else are refused."""
    if isinstance(value, bool) or value is None:
        raise H3AppError(f"{what} must be a number, got {value!r}.")
    if isinstance(value, str):
        value = value.strip()
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise H3AppError(f"{what} must be a number, got {_short(value)}.") from None
    if not math.isfinite(number):
        raise H3AppError(f"{what} must be a finite number, got {_short(value)}.")
    return number


def parse_alpha(value: Any, what: str = "alpha") -> float | None:
    """``None``/``"auto"``/empty → None (the alpha chain's value); else a finite number in (0, MAX_ALPHA]."""
    if value is None or (isinstance(value, str) and value.strip().lower() in AUTO_WORDS):
        return None
    try:
        alpha = parse_number(value, what)
    except H3AppError:
        raise H3AppError(f"{what} must be a positive number such as 8, or auto; got {_short(value)}.") from None
    if alpha <= 0 or alpha > MAX_ALPHA:
        raise H3AppError(f"{what} must be a finite number > 0 (at most {MAX_ALPHA:g}), got {_short(value)}: give a "
                         f"positive number such as 8, or leave it on auto.")
    return alpha


def parse_strength(value: Any, what: str = "scale") -> float:
    """Strength (the ``--scale`` slider) may be negative (slider LoRAs) but must be finite and within ±100."""
    try:
        strength = parse_number(value, what)
    except H3AppError:
        raise H3AppError(f"{what} must be a number such as 1.0, got {_short(value)}.") from None
    if abs(strength) > MAX_STRENGTH:
        raise H3AppError(f"{what} must be between -{MAX_STRENGTH:g} and {MAX_STRENGTH:g}, got {_short(value)}: use a "
                         f"value such as 1.0.")
    return strength


def parse_list(text: Any, what: str, parse_item=parse_number) -> list[Any]:
    """``"8, 16, auto"`` → ``[parse_item("8"), …]``; commas or semicolons separate, empty items are skipped."""
    items = [item.strip() for item in str(text).replace(";", ",").split(",")]
    return [parse_item(item, what) for item in items if item]


def _short(value: Any, limit: int = 60) -> str:
    """``repr`` cut to ``limit`` characters: an error message never echoes megabytes of input."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"
