"""The one LoRA scale formula: ``alpha × strength × group strength / rank`` (``/ √rank`` for rsLoRA).

"strength" is the user's slider (called ``--scale`` on the command line); the result of the formula is the
*effective scale* that multiplies ``B·A``. Every layer that shows or applies a scale calls this module.
"""

from __future__ import annotations

import math


def scale_divisor(rank: int, use_rslora: bool = False) -> float:
    """What ``alpha × strength`` is divided by: the rank, or √rank for rsLoRA (float64)."""
    return math.sqrt(rank) if use_rslora else float(rank)


def effective_scale(alpha: float, strength: float, rank: int, use_rslora: bool = False,
                    group_strength: float = 1.0) -> float:
    """The multiplier of ``B·A`` for one module, in float64."""
    return float(alpha) * float(strength) * float(group_strength) / scale_divisor(rank, use_rslora)
