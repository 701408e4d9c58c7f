"""One parser per kind of user-given value: numbers, alphas, strengths and comma-separated lists.

Every entry point (CLI flags, ``--adapter-spec``, UI boxes, API JSON, settings files) parses through these, so a
value is accepted or refused with the same one-line message wherever it is typed.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import H3AppError
from .choices import DTYPE_NAMES

MAX_ALPHA = 1e6  # alpha × strength / rank beyond this only overflows the model
MAX_STRENGTH = 100.0
MAX_FIELD_CHARS = 4096  # a source, weight name, revision or path: PATH_MAX on Linux
MAX_NAME_PART_CHARS = 255  # one file or folder name: NAME_MAX on Linux
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
        raise H3AppError(f"{what} must be a number, got {short(value)}.") from None
    if not math.isfinite(number):
        raise H3AppError(f"{what} must be a finite number, got {short(value)}.")
    return number


def parse_alpha(value: Any, what: str = "alpha") -> float | None:
    """``None``/``"auto"``/empty → None (the alpha chain's value); else a finite number in (0, MAX_ALPHA]."""
    if value is None or (isinstance(value, str) and value.strip().lower() in AUTO_WORDS):
        return None
    alpha = _number_or(value, f"{what} must be a number such as 8, or auto; got {short(value)}.")
    if alpha is None or alpha <= 0 or alpha > MAX_ALPHA:
        raise H3AppError(f"{what} must be a finite number > 0 (at most {MAX_ALPHA:g}), got {short(value)}: give a "
                         f"positive number such as 8, or leave it on auto.")
    return alpha


def parse_strength(value: Any, what: str = "scale") -> float:
    """Strength (the ``--scale`` slider) may be negative (slider LoRAs) but must be finite and within ±100."""
    strength = _number_or(value, f"{what} must be a number such as 1.0, got {short(value)}.")
    if strength is None or abs(strength) > MAX_STRENGTH:
        raise H3AppError(f"{what} must be finite and between -{MAX_STRENGTH:g} and {MAX_STRENGTH:g}, got "
                         f"{short(value)}: use a value such as 1.0.")
    return strength


def parse_int(value: Any, what: str, low: int | None = None, high: int | None = None) -> int:
    """A whole number (an int, an integral float or a numeric string) within ``[low, high]``."""
    number = parse_number(value, what)
    if number != int(number):
        raise H3AppError(f"{what} must be a whole number, got {short(value)}.")
    if (low is not None and number < low) or (high is not None and number > high):
        bounds = f"between {low} and {high}" if low is not None and high is not None else (
            f"at least {low}" if low is not None else f"at most {high}")
        raise H3AppError(f"{what} must be {bounds}, got {short(value)}.")
    return int(number)


def check_length(text: str, what: str, max_chars: int = MAX_FIELD_CHARS) -> str:
    """``text`` unchanged, or one line naming the limit when it is longer than ``max_chars`` characters."""
    if len(text) > max_chars:
        raise H3AppError(f"{what} is {len(text):,} characters long, more than the {max_chars:,} allowed.")
    return text


def _number_or(value: Any, not_a_number: str) -> float | None:
    """``float(value)``; None when it is a number but not finite; ``not_a_number`` raised when it is no number."""
    if isinstance(value, bool) or value is None:
        raise H3AppError(not_a_number)
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        raise H3AppError(not_a_number) from None
    return number if math.isfinite(number) else None


def parse_list(text: Any, what: str, parse_item=parse_number) -> list[Any]:
    """``"8, 16, auto"`` → ``[parse_item("8"), …]``; commas or semicolons separate, empty items are skipped."""
    items = [item.strip() for item in str(text).replace(";", ",").split(",")]
    return [parse_item(item, what) for item in items if item]


def short(value: Any, limit: int = 60) -> str:
    """``repr`` cut to ``limit`` characters: an error message never echoes megabytes of input."""
    if isinstance(value, (str, bytes)) and len(value) > limit:
        value = value[:limit + 1]  # never repr megabytes only to cut them
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def parse_dtype_name(value: Any, what: str = "dtype") -> str:
    """``float32``/``fp32``/``bfloat16``/``bf16`` (any case) → torch's attribute name, ``float32`` or ``bfloat16``."""
    name = DTYPE_NAMES.get(str(value).strip().lower())
    if name is None:
        raise H3AppError(f"unknown {what} {short(value)}: use float32 or bfloat16.")
    return name
