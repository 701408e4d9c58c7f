"""The frame rule: how many seconds of video MiniMax-H3 can generate, and how many frames that is.

The video VAE encodes clips of ``frames_per_chunk × n + latents_per_chunk`` frames (17n + 5); the pipeline snaps a
request up to the next such count and refuses a snapped count outside ``min_seconds``–``max_seconds`` at ``fps``.
So the longest duration it accepts is the largest 17n + 5 frame count within ``max_seconds`` (345 frames =
14.375 s at 24 fps), not ``max_seconds`` itself. ``RELEASED`` holds the released pipeline's values (diffusers'
MiniMax-H3 modular pipeline) for what must be said before a model is loaded (CLI help, argument checks);
``backend.limits`` reads the loaded pipeline's own rule, and a test holds the two equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import H3AppError

FPS = 24  # MiniMax-H3's fixed frame rate (the pipeline's ``fps``)


@dataclass(frozen=True)
class FrameRule:
    """Frame rate (frames/s), the VAE's chunk (pixel frames per chunk, frames a chunk keeps) and the duration range
    (s) the pipeline checks the snapped frame count against."""

    fps: int = FPS
    frames_per_chunk: int = 17
    latents_per_chunk: int = 5
    min_seconds: float = 5.0
    max_seconds: float = 15.0

    def requested_frames(self, duration: float) -> int:
        """Frames a ``duration`` (s) asks for, before the pipeline snaps it up to 17n + 5."""
        return int(round(duration * self.fps))

    def aligned(self, frames: int) -> int:
        """``frames`` snapped up to the next count the VAE encodes (diffusers' ``align_num_frames``)."""
        extra = (self.latents_per_chunk - frames) % self.frames_per_chunk
        return frames + extra

    def frames(self, duration: float) -> int:
        """Frames the pipeline generates for ``duration`` seconds."""
        return self.aligned(self.requested_frames(duration))

    @property
    def max_frames(self) -> int:
        """The longest clip: the largest 17n + 5 within ``max_seconds``."""
        top = math.floor(self.max_seconds * self.fps + 1e-9)
        return top - (top - self.latents_per_chunk) % self.frames_per_chunk

    @property
    def shortest_seconds(self) -> float:
        """The shortest duration offered (every duration from here to :attr:`longest_seconds` is accepted)."""
        return self.min_seconds

    @property
    def longest_seconds(self) -> float:
        """The longest duration the pipeline accepts exactly: :attr:`max_frames` / fps (14.375 s for H3)."""
        return self.max_frames / self.fps

    def describe(self) -> str:
        """``5–14.375 s (clips of 17n+5 frames at 24 fps, at most 345 frames)`` for help texts and messages."""
        return (f"{self.shortest_seconds:g}–{self.longest_seconds:g} s (clips of {self.frames_per_chunk}n+"
                f"{self.latents_per_chunk} frames at {self.fps} fps, at most {self.max_frames} frames)")

    def check_duration(self, duration: float, what: str = "duration") -> float:
        """``duration`` (s) when the pipeline accepts it, else one line naming the range."""
        if not math.isfinite(duration) or not self.shortest_seconds <= duration <= self.longest_seconds:
            raise H3AppError(f"{what} must be between {self.shortest_seconds:g} and {self.longest_seconds:g} seconds "
                             f"(clips of {self.frames_per_chunk}n+{self.latents_per_chunk} frames at {self.fps} fps: "
                             f"at most {self.max_frames} frames), got {duration:g}.")
        return duration


RELEASED = FrameRule()
