"""One judge: does a request, placed one way, fit a box — and how fast and how dear is it there?

:func:`judge` takes *(request, placement, box)* and answers with a :class:`Verdict`: GPU peak and host RAM (composed
from the full-size rehearsal of that very request, ``planner.measure``, rehearsed once per request and process),
both verdicts against the box, and the spec-sheet prediction (``roofline``). Everything that asks "does it fit?"
asks it: the plan (``planner.make_plan``), the app's start-up check (``preflight``), the app's own choice of
placement (``auto``), the UI's duration and canvas limits (:func:`limits`, given to the backend by ``app.py``), and
the README's suggested hardware (a test). :func:`best` is the fastest placement that fits a box; :func:`limits`
the longest clip that placement holds there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from ..adapters.types import HeaderView
from ..rules.attention import AUTO
from ..rules.choices import MERGED, NO_CACHE, UNMERGED
from ..rules.frames import RELEASED
from ..rules.request_defaults import BY_MODEL, FULL
from .flavors import Flavor
from .planner import (
    HOST_RESERVE,
    PREFERENCE,
    RESERVE,
    Measured,
    Placement,
    compose,
    fits,
    fits_host,
    host_bytes,
    measure,
)
from .rehearsal import PLANNED_VAE_DTYPE, RehearsalOptions

PLACEMENT_FIELDS = ("offload", "fp8", "fp8_text_encoder", "ranks", "ring")
# What ``flavors[].best`` and ``recommended`` carry of the prediction: the video's time, its terms and its price.
PREDICTION_FIELDS = ("step_s", "evaluations", "skipped", "text_encoder_s", "encode_s", "decode_s", "transfer_s",
                     "video_s", "usd_per_video", "attention")
ULYSSES_HEADS = 56  # the full transformer's attention heads: a Ulysses degree must divide them (diffusers checks)


@dataclass(frozen=True)
class PlannedRequest:
    """The request a plan sizes: workflow, canvas (pixels), frames (17n+5 at 24 fps), steps (sigma points) and the
    step cache it runs with (the cache changes the time, not the bytes)."""

    workflow: str
    height: int
    width: int
    frames: int
    steps: int
    cache: str = NO_CACHE

    @property
    def duration(self) -> float:
        """Seconds of video (124 frames → 5.17 s)."""
        return self.frames / RELEASED.fps

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def default_request(model: str = FULL, workflow: str | None = None) -> PlannedRequest:
    """The request a person who sets nothing makes (``rules.request_defaults``), at the canvas it gets."""
    defaults = BY_MODEL[model]
    height, width = defaults.planned_canvas
    return PlannedRequest(workflow or defaults.workflow, height, width, defaults.frames, defaults.steps)


@dataclass(frozen=True)
class Setup:
    """What besides the request and the placement decides the bytes: the model (``full`` sizes or ``tiny``), the
    compute dtype, what the video decoder computes in, q/k/v fusion, and the adapter (a safetensors header) with its
    alpha, scale and LoRA mode; and (time only) the ``--attention`` value: ``auto`` counts the backend the app
    picks on each card (``rules.attention.choose``, its package assumed installed)."""

    model: str = FULL
    dtype: torch.dtype = torch.bfloat16
    vae_dtype: torch.dtype = PLANNED_VAE_DTYPE  # --vae-dtype auto on a GPU box: bf16
    fuse_qkv: bool = False
    adapter: HeaderView | None = None
    alpha: float | None = None
    scale: float = 1.0
    lora_mode: str = UNMERGED
    attention: str = AUTO

    @property
    def lora(self) -> str | None:
        """The LoRA mode the plan counts (None without an adapter)."""
        return self.lora_mode if self.adapter is not None else None


DEFAULT_SETUP = Setup()  # the published model in bf16, no adapter

def rehearsal_options(request: PlannedRequest, setup: Setup) -> RehearsalOptions:
    """The rehearsal of ``request`` on ``setup`` (everything resident; placements are composed from it)."""
    return RehearsalOptions(workflow=request.workflow, size=(request.height, request.width),
                            duration=request.duration, dtype=setup.dtype, fuse_qkv=setup.fuse_qkv,
                            vae_dtype=setup.vae_dtype,
                            adapter=setup.adapter, alpha=setup.alpha, scale=setup.scale, lora_mode=setup.lora_mode)


def measured_for(request: PlannedRequest, setup: Setup) -> Measured:
    """The rehearsal's numbers for ``request`` (rehearsed once per request and setup in this process)."""
    return measure(rehearsal_options(request, setup), setup.model)


@dataclass
class Verdict:
    """The judgement of one (request, placement, box): bytes, both verdicts, and the prediction (None where the
    box's GPU has no spec-sheet entry). ``host_bytes`` counts every rank's process."""

    request: PlannedRequest
    placement: Placement
    box: Flavor
    peak_gpu_bytes: int
    host_bytes: int
    fits_gpu: bool
    fits_host: bool | None
    phases: dict[str, dict[str, int]] = field(default_factory=dict)
    prediction: dict[str, Any] | None = None
    refused: str | None = None  # why the placement cannot run at all (fp8 with merged LoRA)

    @property
    def fits(self) -> bool:
        return self.refused is None and self.fits_gpu and self.fits_host is not False

    @property
    def gpu_margin(self) -> int:
        """GPU bytes left after the reserve (negative: short by that much)."""
        return self.box.gpu_bytes - RESERVE - self.peak_gpu_bytes

    @property
    def host_margin(self) -> int | None:
        return None if self.box.host_bytes is None else self.box.host_bytes - HOST_RESERVE - self.host_bytes

    def best_json(self, dtype: str, vae_dtype: str | None = None) -> dict[str, Any]:
        """``flavors[].best`` of ``plan --json``: the placement, its flags (computing in ``dtype``), both needs and
        margins, the prediction."""
        from .planner import run_options

        prediction = self.prediction or {}
        return {"placement": self.placement.label, "options": run_options(self.placement, dtype, vae_dtype),
                **{name: getattr(self.placement, name) for name in PLACEMENT_FIELDS}, "peak_gpu_bytes": self.peak_gpu_bytes, "host_bytes": self.host_bytes,
                "gpu_margin_bytes": self.gpu_margin, "host_margin_bytes": self.host_margin,
                **{key: prediction.get(key) for key in PREDICTION_FIELDS}}


def judge(request: PlannedRequest, placement: Placement, box: Flavor, setup: Setup = DEFAULT_SETUP,
          measured: Measured | None = None, peaks: Any = None) -> Verdict:
    """THE judgement of ``request`` with ``placement`` on ``box``: GPU peak within one GPU less the reserve, enough
    GPUs for the ranks, host RAM (one process per rank) within the box's less its reserve, and the prediction
    (``peaks``: rates measured on this machine, ``roofline.predict_one``)."""
    from .roofline import predict_one

    measured = measured or measured_for(request, setup)
    lora = setup.lora
    peak, phases = compose(measured, placement, lora)
    host = host_bytes(measured, placement, lora) * max(1, placement.ranks)
    refused = ("fp8 storage keeps LoRA exact only unmerged (a merge would round into fp8): use --lora-mode "
               "unmerged, or drop --fp8." if placement.fp8 and lora == MERGED else None)
    return Verdict(request, placement, box, peak, host, fits(peak, box, placement), fits_host(host, box), phases,
                   predict_one(measured, placement, lora, box, request.steps, request.cache, peaks, setup.attention),
                   refused)


def rank_options(box: Flavor) -> tuple[int, ...]:
    """Context-parallel rank counts worth judging on ``box``: one, and Ulysses over all its GPUs when that degree
    divides the heads (so 2, 4, 7 or 8 GPUs; otherwise the largest such count below)."""
    usable = [n for n in range(2, box.gpus + 1) if ULYSSES_HEADS % n == 0]
    return (1, usable[-1]) if usable else (1,)


def candidates(box: Flavor, setup: Setup = DEFAULT_SETUP, **fixed: Any) -> list[Placement]:
    """Every placement the runtime offers on ``box`` (fastest-first preference, each at every rank count of
    :func:`rank_options`), less those that contradict ``fixed`` (Placement fields a person set; a set ``ranks`` or
    ``ring`` is the only count judged) or the LoRA mode (no fp8 with merged)."""
    ranks, ring = fixed.pop("ranks", None), fixed.pop("ring", None)
    out = []
    for count in (ranks,) if ranks else rank_options(box):
        for placement in PREFERENCE:
            placement = replace(placement, ranks=count, ring=ring or 1)
            if placement.fp8 and setup.lora == MERGED:
                continue
            if all(getattr(placement, name) == value for name, value in fixed.items() if value is not None):
                out.append(placement)
    return out


def _speed_key(verdict: Verdict, index: int) -> tuple[float, int]:
    seconds = (verdict.prediction or {}).get("video_s")
    return (seconds if seconds is not None else float("inf"), index)


def best(request: PlannedRequest, box: Flavor, setup: Setup = DEFAULT_SETUP, placements: list[Placement] | None = None,
         measured: Measured | None = None) -> Verdict | None:
    """The fastest placement that fits ``box`` (predicted seconds per video; ties and unknown GPUs: the preference
    order), or None when nothing fits."""
    measured = measured or measured_for(request, setup)
    verdicts = [judge(request, p, box, setup, measured) for p in (placements or candidates(box, setup))]
    fitting = [(v, i) for i, v in enumerate(verdicts) if v.fits]
    return min(fitting, key=lambda pair: _speed_key(*pair))[0] if fitting else None


def frame_grid(low: int, high: int) -> list[int]:
    """The clip lengths from ``low`` to ``high`` frames the pipeline generates (17n+5)."""
    step = RELEASED.frames_per_chunk
    first = RELEASED.aligned(low)
    return list(range(first, high + 1, step))


def limits(request: PlannedRequest, placement: Placement, box: Flavor, setup: Setup = DEFAULT_SETUP) -> dict[str, Any] | None:
    """The largest request ``placement`` holds on ``box`` at ``request``'s canvas: the longest clip (frames and
    seconds) and that canvas; None when ``request`` itself does not fit.

    Every length reported was judged on its own rehearsal. The search starts at the longest clip; below it, the
    next length tried is where the two nearest judged lengths' margins extrapolate to zero (each phase's bytes grow
    linearly with frames — a test holds that), and the search ends between a length that fits and the next that
    does not."""
    grid = frame_grid(request.frames, RELEASED.max_frames)
    if not judge(request, placement, box, setup).fits:
        return None
    low, high = 0, len(grid) - 1  # grid[low] fits; grid[high] is the candidate above
    if not judge(replace(request, frames=grid[high]), placement, box, setup).fits:
        while high - low > 1:
            probe = _interpolated(request, placement, box, setup, grid, low, high)
            if judge(replace(request, frames=grid[probe]), placement, box, setup).fits:
                low = probe
            else:
                high = probe
    else:
        low = high
    frames = grid[low]
    return {"max_frames": frames, "max_duration_s": frames / RELEASED.fps, "height": request.height,
            "width": request.width, "max_pixels": request.height * request.width}


def _interpolated(request: PlannedRequest, placement: Placement, box: Flavor, setup: Setup, grid: list[int],
                  low: int, high: int) -> int:
    """The grid index strictly between ``low`` and ``high`` where both margins, linear between the two judged
    lengths, last stay non-negative."""
    below = judge(replace(request, frames=grid[low]), placement, box, setup)
    above = judge(replace(request, frames=grid[high]), placement, box, setup)
    share = 1.0
    for margin_low, margin_high in ((below.gpu_margin, above.gpu_margin), (below.host_margin, above.host_margin)):
        if margin_low is not None and margin_high is not None and margin_high < 0 <= margin_low:
            share = min(share, margin_low / (margin_low - margin_high))
    index = low + int(share * (high - low))
    return min(max(index, low + 1), high - 1)


def fitting(request: PlannedRequest, box: Flavor, setup: Setup = DEFAULT_SETUP) -> list[Verdict]:
    """Every placement that fits ``box``, in preference order."""
    measured = measured_for(request, setup)
    return [v for v in (judge(request, p, box, setup, measured) for p in candidates(box, setup)) if v.fits]


def nothing_fits(request: PlannedRequest, box: Flavor, setup: Setup = DEFAULT_SETUP) -> str:
    """Words for a box where no placement fits: what the smallest one needs, and where to look next."""
    from ..rules.units import format_bytes

    measured = measured_for(request, setup)
    smallest = min((judge(request, p, box, setup, measured) for p in candidates(box, setup)),
                   key=lambda v: (v.peak_gpu_bytes, v.host_bytes))
    return (f"no placement fits {box_words(box)} at {request.width}×{request.height}, {request.frames} frames (the "
            f"smallest, {smallest.placement.label}, needs {format_bytes(smallest.peak_gpu_bytes)} of GPU and "
            f"{format_bytes(smallest.host_bytes)} of host RAM): `python -m h3app plan` lists the boxes that fit, or "
            f"run --model tiny")


def box_words(box: Flavor) -> str:
    """``this box (2× NVIDIA A100 80.0 GB, 142.0 GB of host RAM)``."""
    from ..rules.units import format_bytes

    count = f"{box.gpus}× " if box.gpus > 1 else ""
    host = f"{format_bytes(box.host_bytes)} of host RAM" if box.host_bytes is not None else "unknown host RAM"
    return f"this box ({count}{box.gpu} {format_bytes(box.gpu_bytes)}, {host})"
