"""How much work one request may ask for, derived from the loaded model; each refusal is one line naming the limit.

- **Canvas**: MiniMax-H3 generates on at most ``canvas_max_pixels`` pixels (768 × 1344 for the released
  checkpoint: its 768p canvas; 544p fits) with sides a multiple of ``canvas_multiple`` (32) — read from the pipeline.
- **Duration**: the pipeline's frame rule (``rules.frames.FrameRule``, read from the pipeline: fps, the VAE's 17n+5
  chunks, min/max seconds): 5–14.375 s for H3, the longest clip being 345 frames. So pixels × frames is bounded by
  ``canvas_max_pixels`` × ``max_frames``.
- **Steps**: 2–200 (N steps run N−1 transformer evaluations, ``rules.steps``); a hosted server allows 2–100, the
  range other H3 front ends offer.
- **Prompt**: at most 1,024 tokens of the model's own tokenizer (H3 prompts are a few hundred; every token is a
  row of the full-attention sequence). Before tokenising, at most 16 characters per allowed token, so a 100 kB
  prompt is refused without being read.
- **Grid**: at most 64 cells (16 hosted), each one full generation; at most 64 adapter rows (8 hosted: a glob's
  files). The hosted numbers are the hosting room's table (``hosting.limits.LIMITS``).
- **Text fields** (adapter source, weight name, revision, input paths): ``rules.values.MAX_FIELD_CHARS``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..errors import H3AppError
from ..hosting.limits import LIMITS
from ..rules.canvas import check_canvas
from ..rules.frames import FrameRule
from ..rules.prompt import CHARS_PER_TOKEN, MAX_PROMPT_TOKENS
from ..rules.steps import MAX_STEPS, MIN_STEPS

HOSTED_MAX_STEPS = 100
MAX_GRID_CELLS = 64
HOSTED_MAX_GRID_CELLS = LIMITS.grid_cells
MAX_GRID_ROWS = MAX_GRID_CELLS  # every row holds at least one cell
HOSTED_MAX_GRID_ROWS = LIMITS.grid_rows


@dataclass(frozen=True)
class Limits:
    """The caps of one loaded model (pixels, sides in pixels; seconds; counts)."""

    canvas_multiple: int
    max_pixels: int
    frames: FrameRule
    max_steps: int = MAX_STEPS
    max_prompt_tokens: int = MAX_PROMPT_TOKENS
    max_grid_cells: int = MAX_GRID_CELLS
    max_grid_rows: int = MAX_GRID_ROWS
    min_steps: int = MIN_STEPS

    def held_to(self, max_seconds: float, max_pixels: int) -> Limits:
        """These limits within what a box holds (``app.py`` passes the plan's: the longest clip in seconds and the
        largest canvas in pixels its placement fits), never beyond the model's own."""
        frames = replace(self.frames, max_seconds=min(self.frames.max_seconds, float(max_seconds)))
        return replace(self, frames=frames, max_pixels=min(self.max_pixels, int(max_pixels)))

    def check_canvas(self, height: int | None, width: int | None) -> None:
        """The canvas rule (``rules.canvas``) with the loaded pipeline's values; None: the model's own canvas."""
        if height is not None and width is not None:
            check_canvas(height, width, self.canvas_multiple, self.max_pixels)

    def check_steps(self, steps: int) -> None:
        if not self.min_steps <= steps <= self.max_steps:
            raise H3AppError(f"steps must be between {self.min_steps} and {self.max_steps} on this server (N steps "
                             f"run N−1 evaluations), got {steps}.")

    def check_prompt(self, prompt: str, tokenizer: Any) -> int:
        """The prompt's token count, refused above ``max_prompt_tokens`` (too long to tokenise: refused unread)."""
        limit = self.max_prompt_tokens
        if len(prompt) > limit * CHARS_PER_TOKEN:
            raise H3AppError(f"the prompt has {len(prompt):,} characters; prompts are limited to {limit:,} tokens "
                             f"(about {limit * 4:,} characters of English): shorten it.")
        tokens = len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) if tokenizer is not None else 0
        if tokens > limit:
            raise H3AppError(f"the prompt has {tokens:,} tokens, more than the {limit:,} allowed: shorten it.")
        return tokens

    def check_grid(self, cells: int, adapters: int = 1) -> None:
        """Cells (adapters × alphas × scales × seeds) and adapter rows within this server's caps."""
        if cells > self.max_grid_cells:
            raise H3AppError(f"the grid has {cells} cells, more than {self.max_grid_cells} on this server: use "
                             f"fewer values.")
        if adapters > self.max_grid_rows:
            raise H3AppError(f"the grid has {adapters} adapter rows, more than the {self.max_grid_rows} rows a grid "
                             f"may have on this server: give fewer adapters.")

    def check_request(self, request: Any, tokenizer: Any = None) -> None:
        """Every cap that a :class:`~h3app.backend.generation.GenerationRequest` can exceed."""
        self.check_canvas(request.height, request.width)
        self.check_steps(request.steps)
        self.frames.check_duration(request.duration)
        self.check_prompt(request.prompt, tokenizer)


def model_limits(pipe: Any, hosted: bool = False) -> Limits:
    """The caps of ``pipe`` (a MiniMax H3 modular pipeline), tighter for a hosted server."""
    frames = FrameRule(fps=int(pipe.fps), frames_per_chunk=int(pipe.vae_frames_per_chunk),
                       latents_per_chunk=int(pipe.vae_latents_per_chunk), min_seconds=float(pipe.min_duration),
                       max_seconds=float(pipe.max_duration))
    return Limits(canvas_multiple=int(pipe.canvas_multiple), max_pixels=int(pipe.config.canvas_max_pixels),
                  frames=frames,
                  max_steps=HOSTED_MAX_STEPS if hosted else MAX_STEPS,
                  max_grid_cells=HOSTED_MAX_GRID_CELLS if hosted else MAX_GRID_CELLS,
                  max_grid_rows=HOSTED_MAX_GRID_ROWS if hosted else MAX_GRID_ROWS)
