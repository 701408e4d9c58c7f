"""Frozen values that cross module boundaries: one adapter's settings, and a generation request."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from .errors import H3AppError

MODES = ("unmerged", "merged")
QKV_LAYOUTS = ("auto", "blocked", "interleaved")
MAX_ALPHA = 1e6  # alpha × strength / rank beyond this only overflows the model


def check_alpha(alpha: float | None) -> float | None:
    """A user-given alpha must be a finite number > 0 (None means "use the resolved chain value")."""
    if alpha is None:
        return None
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise H3AppError(f"alpha must be a number, got {alpha!r}: give a positive number such as 8, or leave it on auto.")
    if not math.isfinite(alpha) or alpha <= 0 or alpha > MAX_ALPHA:
        raise H3AppError(f"alpha must be a finite number > 0 (at most {MAX_ALPHA:g}), got {alpha!r}: give a "
                         f"positive number such as 8, or leave it on auto.")
    return float(alpha)


def check_strength(strength: float, what: str = "scale") -> float:
    """Strength (a.k.a. scale) may be negative (slider LoRAs) but must be finite and within ±100."""
    if isinstance(strength, bool) or not isinstance(strength, (int, float)):
        raise H3AppError(f"{what} must be a number, got {strength!r}: use a value such as 1.0.")
    if not math.isfinite(strength) or abs(strength) > 100:
        raise H3AppError(f"{what} must be finite and between -100 and 100, got {strength!r}: use a value such as 1.0.")
    return float(strength)


@dataclass(frozen=True)
class LoRASettings:
    """Everything needed to apply one adapter: where it is, and how strongly.

    ``alpha=None`` means the alpha chain's resolved value per module; an explicit alpha replaces alpha only
    (an rsLoRA adapter stays rsLoRA). The effective scale per module is ``alpha * strength / rank``.
    """

    source: str
    weight_name: str | None = None
    revision: str | None = None
    alpha: float | None = None
    strength: float = 1.0
    mode: str = "unmerged"
    group_strengths: Mapping[str, float] = field(default_factory=dict)
    qkv_layout: str = "auto"

    def __post_init__(self) -> None:
        check_alpha(self.alpha)
        check_strength(self.strength)
        for group, value in dict(self.group_strengths).items():
            check_strength(value, what=f"strength of group {group!r}")
        if self.mode not in MODES:
            raise H3AppError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}.")
        if self.qkv_layout not in QKV_LAYOUTS:
            raise H3AppError(f"qkv_layout must be one of {', '.join(QKV_LAYOUTS)}, got {self.qkv_layout!r}.")
