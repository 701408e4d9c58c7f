"""Per-modality strength: one factor per modality of H3's packed sequence, and which rows each LoRA target computes.

MiniMax H3 is single-stream: one set of block weights serves video, text and audio rows. diffusers'
``MiniMaxH3Transformer3DModel.forward`` tags every row of the packed sequence with ``token_tags`` (0 video, 1 text,
2 audio) and each block's AdaLN projection (``adaln_proj.linear``) returns ``6·hidden·3`` features that it views as
three contiguous blocks, one per modality, in tag order (``temb.view(-1, 6·hidden)`` addressed by
``timestep_indices · 3 + token_tags``). So a modality factor applies exactly in two ways: to the delta of each token
row by its tag (every Linear that runs on rows of the sequence), and to the AdaLN delta's output block of each
modality. The time embedder and the output norm's modulation (``norm_out.linear``) run on timestep rows that every
modality reads: no modality factor can reach them alone (``SHARED``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import values

MODALITIES = ("video", "text", "audio")  # in token-tag order (diffusers: 0 video, 1 text, 2 audio)
VIDEO, TEXT, AUDIO = MODALITIES

# What rows a target's Linear computes (``rows_of``), besides one modality's own rows (VIDEO, TEXT, AUDIO):
PACKED = "packed"  # rows of the packed sequence, any modality: each row's token tag names its factor
MODALITY_BLOCKS = "modality_blocks"  # the AdaLN projection: output features in one contiguous block per modality
SHARED = "shared"  # timestep rows every modality reads (time embedder, output norm's modulation)

# The page's video and audio strength sliders (the CLI and the API take any strength, ±values.MAX_STRENGTH)
MODALITY_SLIDER = values.Bounds(0.0, 2.0, where="the strength sliders' range",
                                elsewhere=f"the API and the CLI take up to ±{values.MAX_STRENGTH:g}")


def rows_of(target: str) -> str:
    """Which rows the Linear of canonical ``target`` computes: a modality's own (``video``, ``text``, ``audio``),
    ``packed`` (rows of every modality, told apart by their tags), ``modality_blocks`` or ``shared``."""
    if target.startswith("token_refiner.") or target == "context_embedder":
        return TEXT
    if target == "proj_in":
        return VIDEO
    if target == "audio_proj_in":
        return AUDIO
    if target.startswith("transformer_blocks.") and target.endswith(".adaln_proj.linear"):
        return MODALITY_BLOCKS
    if target.startswith("time_embedder.") or target == "norm_out.linear":
        return SHARED
    return PACKED  # block attention and feed-forward; proj_out / audio_proj_out run over every row too


def parse_modality_strength(value: Any, what: str) -> float:
    """One modality's factor: a strength (finite, within ±100; 0 switches the adapter off for that modality)."""
    return values.parse_strength(value, what)


@dataclass(frozen=True)
class ModalityStrength:
    """The factor of each modality's rows (multiplying strength, group, block and step factors)."""

    video: float = 1.0
    text: float = 1.0
    audio: float = 1.0

    def __post_init__(self) -> None:
        for name in MODALITIES:
            object.__setattr__(self, name, parse_modality_strength(getattr(self, name), f"{name} strength"))

    @property
    def factors(self) -> tuple[float, float, float]:
        """In token-tag order (video, text, audio)."""
        return (self.video, self.text, self.audio)

    @property
    def is_unit(self) -> bool:
        return self.factors == (1.0, 1.0, 1.0)

    def of(self, modality: str) -> float:
        return getattr(self, modality)

    @property
    def label(self) -> str:
        return ", ".join(f"{name} {self.of(name):g}" for name in MODALITIES)

    def to_json(self) -> dict[str, float]:
        return {name: self.of(name) for name in MODALITIES}
