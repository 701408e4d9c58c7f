"""The one LoRA scale formula: ``alpha × strength × group strength × block strength × step factor / rank``
(``/ √rank`` for rsLoRA).

"strength" is the user's slider (called ``--scale`` on the command line); the group strength its per-group factor,
the block strength a factor per main block (``rules.blocks``), the step factor the strength schedule's factor of the
current evaluation (``rules.schedule``; 1 outside a run). The result of the formula is the *effective scale* that
multiplies ``B·A``. Every layer that shows or applies a scale calls this module. The factors multiply left to right
after ``alpha × strength``, so two settings with the same ``alpha × strength`` (8 × 1 and 128 × 0.0625) give the same
float64 product whatever the other factors are.
"""

from __future__ import annotations

import math

# What strength means for a DoRA (PEFT's rule, ``h3app/lora/dora.py``): the formula below scales its low-rank update,
# but the update sits inside a row norm and the magnitude applies at any strength. Said where the strength is set (the
# resolution's warnings: inspect, the alpha card, every job) and in the engine's match report.
DORA_STRENGTH_RULE = ("DoRA (PEFT's rule): strength scales the low-rank update inside the row norm and the magnitude "
                      "applies at any strength, so strength 0 is the magnitude alone, not the base model; the no-LoRA "
                      "baseline is the base.")


def scale_divisor(rank: int, use_rslora: bool = False) -> float:
    """What ``alpha × strength`` is divided by: the rank, or √rank for rsLoRA (float64)."""
    return math.sqrt(rank) if use_rslora else float(rank)


def effective_scale(alpha: float, strength: float, rank: int, use_rslora: bool = False,
                    group_strength: float = 1.0, block_strength: float = 1.0, step_factor: float = 1.0) -> float:
    """The multiplier of ``B·A`` for one module, in float64."""
    return (float(alpha) * float(strength) * float(group_strength) * float(block_strength) * float(step_factor)
            / scale_divisor(rank, use_rslora))
