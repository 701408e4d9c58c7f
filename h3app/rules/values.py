"""One parser per kind of user-given value: numbers, alphas, strengths and comma-separated lists, and the limits
each one checks.

Every entry point (CLI flags, ``--adapter-spec``, UI boxes, API JSON, settings files) parses through these, so a
value is accepted or refused with the same one-line message wherever it is typed. A control that offers a value
takes its ends from the :class:`Bounds` that checks it (``ALPHA``, ``STRENGTH``, ``SCALE_SLIDER``), so what a
slider or a number box shows is what the rule accepts; a value past them is refused in one line, never clamped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import H3AppError
from .choices import DTYPE_NAMES

MAX_ALPHA = 1e6  # alpha × strength / rank beyond this only overflows the model
MAX_STRENGTH = 100.0


@dataclass(frozen=True)
class Bounds:
    """The accepted range of one kind of value: ``low``..``high`` (``low_open``: ``low`` itself excluded);
    ``where`` names the control that offers it in a refusal, ``elsewhere`` where a wider range is taken."""

    low: float
    high: float
    low_open: bool = False
    where: str = ""
    elsewhere: str = ""

    def holds(self, value: float) -> bool:
        return (self.low < value if self.low_open else self.low <= value) and value <= self.high

    def describe(self) -> str:
        """``between -2 and 4`` / ``> 0 and at most 1e+06``."""
        if self.low_open:
            return f"> {self.low:g} and at most {self.high:g}"
        return f"between {self.low:g} and {self.high:g}"

    def check(self, value: float, what: str) -> float:
        """``value`` when it is inside, else one line naming the range (and where a wider one is taken)."""
        if not self.holds(value):
            where = f" {self.where}" if self.where else ""
            wider = f" ({self.elsewhere})" if self.elsewhere else ""
            raise H3AppError(f"{what} {value:g} is outside{where} ({self.describe()}): nothing runs at it, and it "
                             f"is not clamped; type a value in range{wider}.")
        return value


ALPHA = Bounds(0.0, MAX_ALPHA, low_open=True)  # an override alpha, everywhere
STRENGTH = Bounds(-MAX_STRENGTH, MAX_STRENGTH)  # the CLI's --scale, the API's scale, grid and check scales
SCALE_SLIDER = Bounds(-2.0, 4.0, where="the Scale slider's range",
                      elsewhere=f"the API and the CLI take up to ±{MAX_STRENGTH:g}")  # the page's Scale slider
MAX_FIELD_CHARS = 4096  # a source, weight name, revision or path: PATH_MAX on Linux
MIN_SEED, MAX_SEED = 0, 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit integer
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
    if alpha is None or not ALPHA.holds(alpha):
        raise H3AppError(f"{what} must be a finite number > 0 (at most {MAX_ALPHA:g}), got {short(value)}: give a "
                         f"positive number such as 8, or leave it on auto.")
    return alpha


def parse_strength(value: Any, what: str = "scale") -> float:
    """Strength (the ``--scale`` slider) may be negative (slider LoRAs) but must be finite and within ±100."""
    strength = _number_or(value, f"{what} must be a number such as 1.0, got {short(value)}.")
    if strength is None or not STRENGTH.holds(strength):
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


def parse_seeds(text: Any, what: str = "seeds") -> list[int]:
    """A grid's seeds: ``"0, 1"`` → ``[0, 1]``, each refused as one request's seed is (``"1.5"`` is refused, not
    cut to 1), at least one."""
    seeds = parse_list(text, what, lambda item, _: parse_int(item, "seed", MIN_SEED, MAX_SEED))
    if not seeds:
        raise H3AppError(f"{what} needs at least one seed, e.g. 0,1.")
    return seeds


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
