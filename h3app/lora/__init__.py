"""The LoRA math and its binding to the held transformer: deltas, layers, the engine, reports, profile, cache."""

from .delta import compute_lora_delta, stack_group_factors
from .engine import UNCHANGED, LoRAEngine, TargetSlot, discover_targets
from .layers import AdapterScale, LoRAFactors, LoRALinear, PristineStore
from .report import MatchError, MatchReport, ShapeError, TargetMatch

__all__ = [
    "UNCHANGED",
    "AdapterScale",
    "LoRAEngine",
    "LoRAFactors",
    "LoRALinear",
    "MatchError",
    "MatchReport",
    "PristineStore",
    "ShapeError",
    "TargetMatch",
    "TargetSlot",
    "compute_lora_delta",
    "discover_targets",
    "stack_group_factors",
]
