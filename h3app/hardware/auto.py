"""What ``python app.py`` serves when a person sets nothing: the real model, placed as fast as the box allows.

On a box with a CUDA GPU the app serves ``MiniMaxAI/MiniMax-H3`` in bf16 on ``cuda`` with the fastest placement
that fits its GPUs *and* its host RAM (``judge.best`` at the app's default request: offload, fp8 storage, and
context parallel over every GPU when there are several); without a GPU, the tiny model on the CPU. Every flag and
``H3APP_*`` variable a person sets is kept, and the choice fills only what is left (``--offload auto`` set: the
fastest fp8 choice with offload; ``--model tiny`` on a GPU box: tiny on ``cuda``). A real model that no placement
fits is refused in one line naming what would fit, before anything is downloaded. ``H3APP_SKIP_PLAN=1``: nothing
is judged, unset placement flags stay off (``--offload none``, one rank).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

from ..errors import H3AppError
from ..model import repo
from ..rules.choices import REAL_REPO_ID, VAE_AUTO, vae_dtype_for
from .flavors import Flavor
from .judge import PlannedRequest, Setup, Verdict, best, box_words, candidates, default_request, fitting, nothing_fits
from .planner import Placement

GPU_DTYPE, CPU_DTYPE = "bfloat16", "float32"


@dataclass(frozen=True)
class Serving:
    """What the app runs: model, device, dtype and placement (None in a field: not set — by a flag or a variable
    — and left for :func:`choose` to fill)."""

    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    offload: str | None = None
    fp8: bool | None = None
    fp8_text_encoder: bool | None = None
    ulysses: int | None = None
    ring: int | None = None
    vae_dtype: str | None = None  # --vae-dtype as given (None or auto: bf16 on cuda, fp32 on the CPU)

    @property
    def placement(self) -> Placement:
        """The placement of a filled-in choice."""
        ulysses, ring = self.ulysses or 1, self.ring or 1
        return Placement(self.offload or "none", fp8=bool(self.fp8), ranks=ulysses * ring, ring=ring,
                         fp8_text_encoder=bool(self.fp8_text_encoder))

    def filled(self, placement: Placement) -> Serving:
        """This choice with every unset placement field taken from ``placement``."""
        return replace(self, offload=placement.offload if self.offload is None else self.offload,
                       fp8=placement.fp8 if self.fp8 is None else self.fp8,
                       fp8_text_encoder=placement.fp8_text_encoder if self.fp8_text_encoder is None
                       else self.fp8_text_encoder,
                       ulysses=placement.ranks // placement.ring if self.ulysses is None else self.ulysses,
                       ring=placement.ring if self.ring is None else self.ring)

    def environment(self) -> dict[str, str]:
        """The ``H3APP_*`` variables that make a rank started with the same command line choose the same."""
        words = {"model": "H3APP_MODEL", "device": "H3APP_DEVICE", "dtype": "H3APP_DTYPE", "offload": "H3APP_OFFLOAD",
                 "fp8": "H3APP_FP8", "fp8_text_encoder": "H3APP_FP8_TEXT_ENCODER", "ulysses": "H3APP_ULYSSES",
                 "ring": "H3APP_RING", "vae_dtype": "H3APP_VAE_DTYPE"}
        return {words[f.name]: str(int(v) if isinstance(v, bool) else v) for f in fields(self)
                if (v := getattr(self, f.name)) is not None}


@dataclass(frozen=True)
class Choice:
    """The filled-in :class:`Serving`, the line that says what and why, and the judge's verdict (None: not
    judged — tiny, the CPU, or ``H3APP_SKIP_PLAN``)."""

    serving: Serving
    line: str
    verdict: Verdict | None = None


def _base(given: Serving, box: Flavor | None) -> Serving:
    """Model, device and dtype: the given ones, else the real model in bf16 on cuda (a GPU) or tiny in fp32 on
    the CPU (none)."""
    model = given.model or (REAL_REPO_ID if box is not None else repo.TINY)
    device = given.device or ("cuda" if box is not None else "cpu")
    dtype = given.dtype or (GPU_DTYPE if str(device).startswith("cuda") else CPU_DTYPE)
    return replace(given, model=model, device=device, dtype=dtype)


def choose(given: Serving, box: Flavor | None, request: PlannedRequest | None = None) -> Choice:
    """Fill what ``given`` leaves unset for ``box`` (None: no CUDA GPU); ``H3AppError`` (one line, before any
    download) when the real model cannot fit it however placed."""
    serving = _base(given, box)
    if box is None:
        serving = serving.filled(Placement())
        return Choice(serving, f"no CUDA GPU: serving {serving.model} on {serving.device} in {serving.dtype} "
                               f"(a GPU box serves {REAL_REPO_ID}; flags or H3APP_* variables choose otherwise)")
    plain = serving.filled(Placement())
    if serving.model == repo.TINY or not str(serving.device).startswith("cuda"):
        return Choice(plain, f"serving {serving.model} on {serving.device} in {serving.dtype} with "
                             f"{plain.placement.label}, as asked ({box.gpu} seen)")
    if os.environ.get("H3APP_SKIP_PLAN") == "1":
        return Choice(plain, f"H3APP_SKIP_PLAN=1: serving {serving.model} on {serving.device} with "
                             f"{plain.placement.label}, not judged against {box_words(box)}")
    if all(value is not None for value in (serving.offload, serving.fp8, serving.fp8_text_encoder, serving.ulysses,
                                           serving.ring)):
        return Choice(serving, f"serving {serving.model} on {serving.device} in {serving.dtype} with "
                               f"{serving.placement.label}, as asked (judged next against {box_words(box)})")
    from ..model.loader import parse_dtype

    request = request or default_request()
    assert serving.dtype is not None  # _base fills model, device and dtype
    setup = Setup(dtype=parse_dtype(serving.dtype),
                  vae_dtype=parse_dtype(vae_dtype_for(serving.vae_dtype or VAE_AUTO, str(serving.device))))
    fixed = {"offload": serving.offload, "fp8": serving.fp8, "fp8_text_encoder": serving.fp8_text_encoder,
             "ring": serving.ring, "ranks": (serving.ulysses or 1) * (serving.ring or 1)
             if serving.ulysses is not None or serving.ring is not None else None}
    verdict = best(request, box, setup, candidates(box, setup, **fixed) or None)
    if verdict is None or not _matches(verdict.placement, fixed):
        raise _refusal(serving, box, setup, request, fixed)
    chosen = serving.filled(verdict.placement)
    return Choice(chosen, _line(chosen, verdict, box, request), verdict)


def _matches(placement: Placement, fixed: dict) -> bool:
    return all(getattr(placement, name) == value for name, value in fixed.items() if value is not None)


def _refusal(serving: Serving, box: Flavor, setup: Setup, request: PlannedRequest, fixed: dict) -> H3AppError:
    asked = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in fixed.items()
                     if value is not None and name != "ranks") or "any placement"
    working = [v.placement.label for v in fitting(request, box, setup)]
    if working:
        return H3AppError(f"{serving.model} with {asked} does not fit {box_words(box)} at {request.width}×"
                          f"{request.height}, {request.frames} frames: use {' or '.join(working[:3])}; nothing was "
                          f"downloaded.")
    return H3AppError(f"{serving.model}: {nothing_fits(request, box, setup)}; nothing was downloaded.")


def _line(chosen: Serving, verdict: Verdict, box: Flavor, request: PlannedRequest) -> str:
    """``auto placement: MiniMaxAI/MiniMax-H3 in bfloat16 on cuda with --offload none --fp8 …: the fastest that fits
    this box (…) for t2va 1344×768, 124 frames, 20 steps — GPU 74.3 of 96.0 GB (margin 18.7 GB), host …``."""
    from .summary import margins

    seconds = (verdict.prediction or {}).get("video_s")
    speed = f", about {seconds:,.0f} s a video (spec-sheet prediction)" if seconds is not None else ""
    return (f"auto placement: {chosen.model} in {chosen.dtype} on {chosen.device} with {verdict.placement.label}: "
            f"the fastest that fits {box_words(box)} for {request.workflow} {request.width}×{request.height}, "
            f"{request.frames} frames, {request.steps} steps — "
            + margins(verdict.peak_gpu_bytes, verdict.host_bytes, box.gpu_bytes, box.host_bytes)
            + f"{speed}; flags and H3APP_* variables override")
