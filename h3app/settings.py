"""Frozen values that cross module boundaries: one adapter's settings, and a generation request."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import H3AppError
from .rules import values
from .rules.choices import LORA_MODES, QKV_LAYOUTS

MODES = LORA_MODES  # the name the LoRA engine imports


def check_alpha(alpha: Any) -> float | None:
    """A user-given alpha: None (the alpha chain's value) or a finite number in (0, 1e6] (``rules.values``)."""
    return values.parse_alpha(alpha)


def check_strength(strength: Any, what: str = "scale") -> float:
    """A strength (``--scale``): finite, within ±100, may be negative (``rules.values``)."""
    return values.parse_strength(strength, what)


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
    skip_parts: tuple[str, ...] = ()  # part kinds left out (``adaln``: a pruned-base file's AdaLN parts)
    any_partition: bool = False  # apply a file made for the other transformer partition anyway

    def __post_init__(self) -> None:
        source = os.fspath(self.source) if isinstance(self.source, os.PathLike) else self.source
        if not isinstance(source, str):  # an empty one is refused where sources are parsed ("SOURCE is empty")
            raise H3AppError(f"the adapter source must be a Hub repo id, an HF URL or a local path, got "
                             f"{values.short(source)}.")
        object.__setattr__(self, "source", values.check_length(source, "the adapter source"))
        for name in ("weight_name", "revision"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise H3AppError(f"{name} must be text, got {values.short(value)}.")
            if value is not None:
                values.check_length(value, name)
        object.__setattr__(self, "alpha", check_alpha(self.alpha))
        object.__setattr__(self, "strength", check_strength(self.strength))
        object.__setattr__(self, "group_strengths", {
            group: check_strength(value, what=f"strength of group {group!r}")
            for group, value in dict(self.group_strengths).items()})
        if self.mode not in LORA_MODES:
            raise H3AppError(f"mode must be one of {', '.join(LORA_MODES)}, got {self.mode!r}.")
        if self.qkv_layout not in QKV_LAYOUTS:
            raise H3AppError(f"qkv_layout must be one of {', '.join(QKV_LAYOUTS)}, got {self.qkv_layout!r}.")
        skip = (self.skip_parts,) if isinstance(self.skip_parts, str) else self.skip_parts
        if not all(isinstance(kind, str) for kind in skip):
            raise H3AppError(f"skip_parts must be part kinds such as 'adaln', got {values.short(self.skip_parts)}.")
        object.__setattr__(self, "skip_parts", tuple(sorted({kind.strip().lower() for kind in skip if kind.strip()})))
        object.__setattr__(self, "any_partition", bool(self.any_partition))
