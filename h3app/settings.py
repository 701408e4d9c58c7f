"""One adapter's settings, a frozen value that crosses module boundaries (the generation request is ``h3app.request``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import H3AppError
from .rules import values
from .rules.blocks import BlockStrength, parse_block_strength
from .rules.choices import LORA_MODES, MERGED, QKV_LAYOUTS, UNMERGED
from .rules.modality import MODALITIES, ModalityStrength, parse_modality_strength
from .rules.schedule import StrengthSchedule, parse_schedule


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
    (an rsLoRA adapter stays rsLoRA). The effective scale per module is ``alpha * strength * group * block * step /
    rank`` (``rules.scale``); per-modality factors multiply each token row's delta (docs/lora-engine.md, "Advanced
    strength"). A modality factor other than 1 or a schedule in merged mode is refused here, in one line.
    """

    source: str
    weight_name: str | None = None
    revision: str | None = None
    alpha: float | None = None
    strength: float = 1.0
    mode: str = UNMERGED
    group_strengths: Mapping[str, float] = field(default_factory=dict)
    qkv_layout: str = "auto"
    skip_parts: tuple[str, ...] = ()  # part kinds left out (``adaln``: a pruned-base file's AdaLN parts)
    any_partition: bool = False  # apply a file made for the other transformer partition anyway
    # Advanced strength (docs/lora-engine.md): a factor per modality's rows, a schedule over the evaluations, a factor
    # per main block. The schedule and the block ranges are kept in their canonical spelling ("" = none).
    video_strength: float = 1.0
    text_strength: float = 1.0
    audio_strength: float = 1.0
    strength_schedule: str = ""
    block_strength: str = ""

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
        for modality in MODALITIES:
            name = f"{modality}_strength"
            object.__setattr__(self, name, parse_modality_strength(getattr(self, name), f"{modality} strength"))
        schedule = parse_schedule(self.strength_schedule)
        object.__setattr__(self, "strength_schedule", schedule.label if schedule is not None else "")
        object.__setattr__(self, "block_strength", parse_block_strength(self.block_strength).label)
        refusal = merged_refusal(self.modality, schedule) if self.mode == MERGED else None
        if refusal:
            raise H3AppError(refusal)

    @property
    def modality(self) -> ModalityStrength:
        """The factor of each modality's rows (video, text, audio)."""
        return ModalityStrength(self.video_strength, self.text_strength, self.audio_strength)

    @property
    def schedule(self) -> StrengthSchedule | None:
        """The strength schedule over a run's evaluations, None when there is none."""
        return parse_schedule(self.strength_schedule)

    @property
    def blocks(self) -> BlockStrength:
        """The factor per main block."""
        return parse_block_strength(self.block_strength)


def merged_refusal(modality: ModalityStrength, schedule: StrengthSchedule | None) -> str | None:
    """Why merged mode cannot run these advanced strengths (one line), None when it can: a merge bakes one
    strength into every row of a weight for every evaluation."""
    if not modality.is_unit:
        return (f"merged mode bakes one strength into the weights, for every modality: per-modality strength "
                f"({modality.label}) needs --lora-mode unmerged.")
    if schedule is not None:
        return (f"merged mode bakes one strength into the weights, for every evaluation: a strength schedule "
                f"({schedule.label}) needs --lora-mode unmerged.")
    return None
