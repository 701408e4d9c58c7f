"""The equivalence check's two settings, A and B: the pair type, its ``ALPHA:SCALE`` text form, the default pair
(LightX2V's rank-128 Turbo, trained at alpha 8: 8 × 1.0 against 128 × 0.0625) and the pair chosen from an
adapter's own alpha and rank. Torch-free, so the CLI's parser and the UI read the same defaults the backend runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import H3AppError
from . import values


@dataclass(frozen=True)
class CheckSetting:
    """One side of the comparison: ``alpha`` (None = the alpha chain's value, written ``auto``) and strength."""

    alpha: float | None
    strength: float

    @property
    def label(self) -> str:
        alpha = "auto" if self.alpha is None else f"{self.alpha:g}"
        return f"{alpha}:{self.strength:g}"


DEFAULT_A = CheckSetting(alpha=8.0, strength=1.0)  # LightX2V's rank-128 Turbo: trained at alpha 8
DEFAULT_B = CheckSetting(alpha=128.0, strength=0.0625)


def parse_setting(text: str, flag: str = "--a") -> CheckSetting:
    """``ALPHA:SCALE`` with ALPHA a number or ``auto``, e.g. ``8:1.0``, ``auto:0.5``."""
    alpha_text, sep, strength_text = str(text).partition(":")
    if not sep:
        raise H3AppError(f"{flag} must be ALPHA:SCALE such as 8:1.0 or auto:1.0, got {values.short(text)}.")
    return CheckSetting(values.parse_alpha(alpha_text, f"{flag} alpha"),
                        values.parse_strength(strength_text, f"{flag} scale"))


def default_pair(alpha: float | None, rank: int | None) -> tuple[CheckSetting, CheckSetting]:
    """The check's A and B for an adapter whose alpha in use is ``alpha`` and whose (uniform) rank is ``rank``:
    A = (alpha, strength 1), B = (rank, alpha / rank) — the same alpha × strength, so an exact engine makes them
    bit-identical (the fallback column runs at alpha = rank). When alpha already equals the rank, B doubles alpha
    and halves the strength instead (A = B would test nothing). Without one alpha or one rank (mixed per module):
    the LightX2V pair, :data:`DEFAULT_A` against :data:`DEFAULT_B`."""
    if alpha is None or not rank or alpha <= 0:
        return DEFAULT_A, DEFAULT_B
    a = CheckSetting(alpha=float(alpha), strength=1.0)
    if float(alpha) == float(rank):
        return a, CheckSetting(alpha=2.0 * float(rank), strength=0.5)
    return a, CheckSetting(alpha=float(rank), strength=float(alpha) / float(rank))
