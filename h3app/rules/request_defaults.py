"""Every request default, once, per model: what a request asks for when the person gives nothing.

The tiny checkpoint and the full MiniMax-H3 differ (docs/hardware.md, "The default request"):

- **full** (``MiniMaxAI/MiniMax-H3``, a local copy of it, ``plan --model full``): the published request — the
  pipeline's own canvas (16:9 at a 768 short edge, 1344×768, or the keyframe's aspect), 5 s = 124 frames at 24 fps,
  and :data:`FULL_STEPS` sigma points for the undistilled (guidance-distilled, one forward a step) base.
- **tiny** (the embedded ``assets/tiny-h3``): its small canvas, 5 s, and the 5 points its trained Turbo LoRA was
  distilled for, so a CPU run takes seconds.

A registry preset (``adapters.known``) still sets a distilled adapter's own steps and shifts when that adapter is
picked; these are the values without one. Every front end reads them from here: the CLI commands, the UI's controls
and forms, the API's inputs, the backend's bare request, the plan and the reproduction snippets.
"""

from __future__ import annotations

from dataclasses import dataclass

from .check_pair import DEFAULT_A, DEFAULT_B
from .choices import REAL_REPO_ID, T2VA, TINY_REPO_ID
from .frames import RELEASED

TINY, FULL = "tiny", "full"  # the two kinds of model a request is sized for

# The seed of a request that names none, the same for every model and front end. 7: the held-out seed of the tiny
# Turbo demo (trained on seeds 1000+, docs/demo.md), which the UI and API already offered; a run records its seed.
SEED = 7
# num_inference_steps of the full model: sigma points including the terminal 0, so 20 run 19 forwards. diffusers
# gives no count; community runs of the base use about 20 (LightX2V, Wan2GP 15–20, sglang's generic web UI 20);
# sglang's H3 UI and a vLLM-omni cookbook default to 50. 20 is the fewest the sources call good: a rented box bills
# every step, and 50 costs 2.6× as much per video for a base that is already guidance-distilled.
FULL_STEPS = 20
TINY_STEPS = 5  # the tiny Turbo LoRA's 5 points (4 evaluations), which the tiny base also runs quickly

# The page's prompts. The full model: the published request's kind of prompt (a scene and its sound). The tiny model
# was trained on one sentence pattern only (model/tiny_training/scenes.py, ``PromptWords.text``; a test holds every
# tiny prompt here to that grammar): any other text gives it a blur, so its default and samples are sentences of it.
FULL_PROMPT = "a red fox running through fresh snow at dawn, wind howling, crunching footsteps"
TINY_GRAMMAR = ("a {red|yellow|green|blue} ball moving {left|right|up|down} over a {grey|sand} floor, "
                "{low|high} {soft|loud} hum")
TINY_PROMPT = "a red ball moving right over a grey floor, low soft hum"
TINY_SAMPLES = ("a blue ball moving left over a sand floor, high loud hum",
                "a yellow ball moving down over a grey floor, low loud hum",
                "a green ball moving up over a sand floor, high soft hum")
TINY_KNOWS = (f"The tiny demo model knows one kind of sentence: “{TINY_GRAMMAR}”. Other words give a blur; the "
              "full MiniMax H3 takes any prompt.")


@dataclass(frozen=True)
class GridAxes:
    """The Grid's axes as typed: comma-separated alphas (``auto`` allowed), scales and seeds."""

    alphas: str
    scales: str
    seeds: str


@dataclass(frozen=True, kw_only=True)
class RequestValues:
    """The values of a request that a model has a default for, each declared once: a request
    (``h3app.request.GenerationRequest``) and a model's defaults (:class:`RequestDefaults`) both are these.
    ``steps``: sigma points (N run N − 1 evaluations); ``duration`` in seconds; ``height``/``width`` None: the
    pipeline's own canvas (16:9 at its short edge, or the keyframe's aspect); ``shift``/``audio_shift`` None: the
    pipeline's (12 video, 3 audio for H3). A bare value is the tiny model's; every front end fills its model's."""

    seed: int = SEED
    steps: int = TINY_STEPS
    duration: float = RELEASED.shortest_seconds
    height: int | None = None
    width: int | None = None
    shift: float | None = None
    audio_shift: float | None = None
    workflow: str = T2VA


@dataclass(frozen=True)
class RequestDefaults(RequestValues):
    """One model's request defaults (:class:`RequestValues`, given by keyword, and what the page and the plan need).
    ``planned_canvas``: (height, width) the plan judges — the canvas a t2va request without a size gets, the largest
    the model generates."""

    model: str
    planned_canvas: tuple[int, int]
    grid: GridAxes
    canvas_multiple: int  # the canvas rule its pipeline checks (``backend.limits`` reads the loaded one's; a test
    max_pixels: int  # holds them equal): sides a multiple of this, height × width at most ``max_pixels``
    prompt: str = FULL_PROMPT  # the page's prompt box before anything is typed
    sample_prompts: tuple[str, ...] = ()  # one-click prompts the model understands (the page's sample buttons)
    knows: str = ""  # one line on what prompts the model understands (empty: any)

    @property
    def frames(self) -> int:
        """Frames the default duration generates (124 for H3's 5 s: 17n+5 at 24 fps)."""
        return RELEASED.frames(self.duration)


FULL_DEFAULTS = RequestDefaults(
    FULL, steps=FULL_STEPS, planned_canvas=(768, 1344), canvas_multiple=32, max_pixels=768 * 1344,
    # the check pair's two alphas and two scales: the grid's diagonal is the equivalence check (LightX2V rank 128)
    grid=GridAxes(f"{DEFAULT_A.alpha:g}, {DEFAULT_B.alpha:g}", f"{DEFAULT_B.strength:g}, {DEFAULT_A.strength:g}",
                  f"{SEED}"))
TINY_DEFAULTS = RequestDefaults(
    TINY, steps=TINY_STEPS, planned_canvas=(64, 96), canvas_multiple=8, max_pixels=64 * 96,  # its largest canvas
    prompt=TINY_PROMPT, sample_prompts=(TINY_PROMPT, *TINY_SAMPLES), knows=TINY_KNOWS,
    # its trained Turbo LoRA (rank 16, alpha 1 = r/16) against the alpha = rank fallback, at 1/16 and 1
    grid=GridAxes("1, 16", "0.0625, 1", f"{SEED}"))
BY_MODEL = {FULL: FULL_DEFAULTS, TINY: TINY_DEFAULTS}


def defaults_for(model: str | None) -> RequestDefaults:
    """The defaults of ``model``: ``tiny`` (or the tiny checkpoint's repo id) → the tiny ones; anything else (the
    Hub repo, a local copy, ``full``) → the full model's."""
    return TINY_DEFAULTS if str(model) in (TINY, TINY_REPO_ID) else FULL_DEFAULTS


def known_canvas(model: str | None) -> RequestDefaults | None:
    """The defaults whose canvas rule ``model`` is known to follow before it is loaded: the tiny checkpoint or
    the published model by name (a local folder's rule is its pipeline's, read when it loads)."""
    return BY_MODEL[TINY] if str(model) in (TINY, TINY_REPO_ID) else (
        FULL_DEFAULTS if str(model) in (FULL, REAL_REPO_ID) else None)
