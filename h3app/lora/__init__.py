"""The LoRA math and its binding to the held transformer: scales, deltas, layers, pristine copies, the engine,
reports, profile, cache."""

from .cache import AdapterCache, AdapterKey
from .delta import compute_lora_delta, stack_group_factors
from .engine import LoRAEngine
from .layers import LoRAFactors, LoRALinear
from .pristine import PristineStore
from .profile import StrengthProfile
from .report import Coverage, MatchError, MatchReport, ShapeError, TargetMatch
from .scaling import AdapterScale, ModuleAlpha, ScaleEntry
from .targets import TargetSlot, discover_targets
from .validation import UNCHANGED

__all__ = [
    "UNCHANGED",
    "AdapterCache",
    "AdapterKey",
    "AdapterScale",
    "Coverage",
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
