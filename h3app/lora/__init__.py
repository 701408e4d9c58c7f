"""The LoRA math and its binding to the held transformer: scales, deltas, layers, pristine copies, the engine,
reports, profile, cache."""

from .cache import AdapterCache, AdapterKey
from .delta import compute_lora_delta, stack_group_factors
from .engine import UNCHANGED, LoRAEngine, TargetSlot, discover_targets
from .layers import LoRAFactors, LoRALinear
from .pristine import PristineStore
from .profile import StrengthProfile
from .report import MatchError, MatchReport, ShapeError, TargetMatch
from .scaling import AdapterScale, ModuleAlpha, ScaleEntry

__all__ = [
    "UNCHANGED",
    "AdapterCache",
    "AdapterKey",
    "AdapterScale",
    "LoRAEngine",
    "LoRAFactors",
    "LoRALinear",
    "MatchError",
    "MatchReport",
    "ModuleAlpha",
    "PristineStore",
    "ScaleEntry",
    "ShapeError",
    "StrengthProfile",
    "TargetMatch",
    "TargetSlot",
    "compute_lora_delta",
    "discover_targets",
    "stack_group_factors",
]
