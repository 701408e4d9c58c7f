"""One generation request: a frozen value, checked when it is made, that loads no torch (the UI's forms, the
commands and the plan build it before any model is loaded; ``h3app.backend.generation`` runs it).

Each refusal is one line naming the value and the fix. The loaded model's own limits (its canvas rule, its
tokenizer's count, a shorter longest clip) are checked again when it runs (``backend.limits``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .errors import H3AppError
from .rules import values
from .rules.choices import FL2VA, NO_CACHE, REF2VA, WORKFLOWS, check_cache, check_workflow
from .rules.frames import RELEASED
from .rules.prompt import MAX_PROMPT_CHARS, MAX_PROMPT_TOKENS
from .rules.request_defaults import RequestValues
from .rules.steps import MAX_STEPS, MIN_STEPS
from .rules.values import MAX_SEED, MIN_SEED


@dataclass(frozen=True)
class GenerationRequest(RequestValues):
    """Everything that determines one output (with the adapters, added by the backend): the prompt and input files
    here, the values a model has defaults for (seed, steps, duration, canvas, shifts, workflow) from
    :class:`RequestValues`, by keyword."""

    prompt: str
    first_frame: str | None = None
    last_frame: str | None = None
    references: tuple[str, ...] = ()
    cache: str = NO_CACHE  # the step cache (``model/denoise_cache.py``): none, or fbc

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise H3AppError("the prompt is empty: describe the video you want.")
        if len(self.prompt) > MAX_PROMPT_CHARS:  # the token cap needs the model's tokenizer: refused unread here
            raise H3AppError(f"the prompt has {len(self.prompt):,} characters; prompts are limited to "
                             f"{MAX_PROMPT_TOKENS:,} tokens (about {MAX_PROMPT_TOKENS * 4:,} characters of English): "
                             f"shorten it.")
        fix = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 - frozen: normalise in place
        fix("seed", values.parse_int(self.seed, "seed", MIN_SEED, MAX_SEED))
        steps = values.parse_number(self.steps, "steps")
        if not MIN_STEPS <= steps <= MAX_STEPS or steps != int(steps):
            raise H3AppError(f"steps must be a whole number between {MIN_STEPS} and {MAX_STEPS} (N steps run N−1 "
                             f"evaluations), got {values.short(self.steps)}.")
        fix("steps", int(steps))
        # Refused before any model is loaded by the released rule; the loaded pipeline's (Limits) is checked again.
        fix("duration", RELEASED.check_duration(values.parse_number(self.duration, "duration")))
        if (self.height is None) != (self.width is None):
            raise H3AppError("give both --height and --width, or neither (then the model's default canvas is used).")
        for name in ("height", "width"):
            if getattr(self, name) is not None:
                fix(name, values.parse_int(getattr(self, name), name, 1, None))
        for name in ("shift", "audio_shift"):
            value = getattr(self, name)
            if value is not None:
                number = values.parse_number(value, name)
                if number <= 0:
                    raise H3AppError(f"{name} must be a positive number, got {values.short(value)}.")
                fix(name, number)
        if not isinstance(self.workflow, str):
            raise H3AppError(f"workflow must be one of {', '.join(WORKFLOWS)}, got {values.short(self.workflow)}.")
        references = (self.references,) if isinstance(self.references, str) else self.references
        for name, value in (("first_frame", self.first_frame), ("last_frame", self.last_frame),
                            *(("reference", r) for r in references)):
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise H3AppError(f"{name} must be a file path, got {values.short(value)}.")
            if value is not None:
                values.check_length(os.fspath(value), name)
        fix("references", tuple(os.fspath(r) for r in references))
        check_workflow(self.workflow)
        check_cache(self.cache)
        keyframes = [f for f in (self.first_frame, self.last_frame) if f]
        if self.workflow == FL2VA and not keyframes:
            raise H3AppError("fl2va needs a first and/or last keyframe image: give --first-frame and/or --last-frame.")
        if self.workflow != FL2VA and keyframes:
            raise H3AppError(f"keyframes are for the fl2va workflow, not {self.workflow}: add --workflow fl2va.")
        if self.workflow == REF2VA and not self.references:
            raise H3AppError("ref2va needs at least one reference (image, video or audio): give --reference FILE.")
        if self.workflow != REF2VA and self.references:
            raise H3AppError(f"references are for the ref2va workflow, not {self.workflow}: add --workflow ref2va.")
        for path in (*keyframes, *self.references):
            if not Path(path).is_file():
                raise H3AppError(f"input file {path!r} does not exist: check the path.")
        for path in self.references:
            reference_kind(path)

    @property
    def num_frames(self) -> int:
        """Frames requested at the released rule's fps (the pipeline snaps up to the 17n+5 rule)."""
        return RELEASED.requested_frames(self.duration)

    def to_json(self) -> dict[str, Any]:
        """The request as JSON (input files by their paths; a hosted answer names them by file name), the prompt
        first."""
        return {"prompt": self.prompt, **{k: v for k, v in asdict(self).items() if k != "prompt"}}


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
VIDEO_SUFFIXES = (".mp4", ".mov", ".webm", ".mkv", ".avi")
AUDIO_SUFFIXES = (".wav", ".mp3", ".flac", ".ogg", ".m4a")


def reference_kind(path: str) -> str:
    """``image`` | ``video`` | ``audio`` from the file suffix (ref2va references)."""
    suffix = Path(path).suffix.lower()
    for kind, suffixes in (("image", IMAGE_SUFFIXES), ("video", VIDEO_SUFFIXES), ("audio", AUDIO_SUFFIXES)):
        if suffix in suffixes:
            return kind
    raise H3AppError(f"reference {Path(path).name!r} is not an image, video or audio file I know "
                     f"({', '.join(IMAGE_SUFFIXES + VIDEO_SUFFIXES + AUDIO_SUFFIXES)}).")
