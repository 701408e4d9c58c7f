"""ZeroGPU: the one door to the ``spaces`` package, and the duration each GPU call asks for.

Three homes, one code path (docs/hardware.md, "ZeroGPU"):

- ``SPACES_ZERO_GPU`` unset and ``H3APP_ZEROGPU_FORK`` unset (a dedicated box, the CPU, the tests): :func:`gpu`
  returns the function unchanged, as ``spaces.GPU`` itself does there (``spaces/zero/decorator.py``: ``if not
  Config.zero_gpu: return task``); the backend never wraps a job.
- ``SPACES_ZERO_GPU`` set (a ZeroGPU Space): :func:`gpu` is ``spaces.GPU(fn, duration=…, size="xlarge")``: every
  call runs in a forked child that holds the whole RTX Pro 6000 (96 GB) for the seconds it declared.
- ``H3APP_ZEROGPU_FORK=1`` (the stand-in, ``zero_gpu_fork``): every call runs in a freshly forked child here, on
  whatever device the model is on, with the same pickled arguments, streamed results and cancel.

Durations: a call declares ``START_S + (1 + MARGIN) × predicted`` seconds (the time model's prediction for the
request on this card; ``declared``), and a call whose quota — declared seconds × the size's quota factor, what
``spaces`` prints as "requested" — is over :data:`CAP_S` is refused before anything is asked for (``check``).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import H3AppError

ZERO_GPU_ENV = "SPACES_ZERO_GPU"  # set by the platform on a ZeroGPU Space (spaces/config.py)
FORK_ENV = "H3APP_ZEROGPU_FORK"  # the stand-in: every decorated call in a forked child, here
CAP_ENV = "H3APP_ZEROGPU_CAP_S"
SPACES = "spaces"
FORK = "fork"

SIZE = "xlarge"  # the whole card: H3 with both fp8 flags needs ~79 GB (plan --hardware zero-gpu-xlarge)
QUOTA_FACTOR = {"large": 1, "xlarge": 2}  # spaces/zero/client.py: an xlarge call's requested quota is doubled
# The per-call cap on the quota one call requests: ZeroGPU's staff give 5 minutes as the most one call may ask for
# ("The requested GPU duration (300s) is larger than the maximum allowed"); the platform changes it over time, so a
# Space may set H3APP_ZEROGPU_CAP_S.
CAP_S = 300
MARGIN = 0.25  # the share added to the prediction: the time model is a spec-sheet roofline, not a measurement
START_S = 20  # a fresh child's start: fork, CUDA init, the packed weights copied onto the granted card
LOAD_S = 60  # a Load job (download + bind, no denoising): no time model prediction, a stated allowance
# Daily quota seconds per visitor tier: PRO 40 minutes (spaces/zero/client.py PRO_QUOTA_MINUTES), PRO gets 8× a
# free account's (hub-docs spaces-zerogpu.md).
DAILY_QUOTA_S = {"free": 40 * 60 // 8, "pro": 40 * 60}
_EMULATION = threading.Lock()


def mode() -> str | None:
    """``"spaces"`` on a ZeroGPU Space, ``"fork"`` under the stand-in, None elsewhere (same truth test as
    ``spaces.config.boolean``)."""
    if os.environ.get(ZERO_GPU_ENV, "").lower() in ("1", "t", "true"):
        return SPACES
    if os.environ.get(FORK_ENV, "") == "1":
        return FORK
    return None


def cap_s() -> int:
    """The per-call quota cap (:data:`CAP_S`, or ``H3APP_ZEROGPU_CAP_S``)."""
    value = os.environ.get(CAP_ENV, "").strip()
    if not value:
        return CAP_S
    try:
        cap = int(value)
    except ValueError:
        cap = 0
    if cap <= 0:
        raise H3AppError(f"{CAP_ENV} must be a whole number of seconds such as 300, got {value!r}.")
    return cap


@dataclass(frozen=True)
class Duration:
    """What one GPU call asks for: ``duration_s`` declared (``spaces.GPU``'s ``duration``), ``quota_s`` it
    requests from the visitor's quota (× the size's factor; the quota left must cover it), from ``predicted_s``
    (None: a stated allowance); ``charged_s``: the quota the predicted work uses (the platform charges the seconds
    a call ran, × the factor)."""

    duration_s: int
    size: str
    quota_s: int
    predicted_s: float | None
    margin: float
    start_s: int
    cap_s: int
    mode: str | None
    charged_s: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def declared(predicted_s: float | None, allowance_s: int = LOAD_S) -> Duration:
    """The duration a call declares for ``predicted_s`` seconds of work (None: ``allowance_s``)."""
    seconds = allowance_s if predicted_s is None else START_S + (1 + MARGIN) * predicted_s
    duration = max(1, math.ceil(seconds))
    charged = None if predicted_s is None else math.ceil(predicted_s * QUOTA_FACTOR[SIZE])
    return Duration(duration, SIZE, duration * QUOTA_FACTOR[SIZE], predicted_s, MARGIN, START_S, cap_s(), mode(),
                    charged)


def largest_work_s(cap: int | None = None) -> float:
    """The most predicted seconds of work one call may hold under the cap."""
    cap = cap_s() if cap is None else cap
    return (cap / QUOTA_FACTOR[SIZE] - START_S) / (1 + MARGIN)


def check(duration: Duration, what_fits: str) -> Duration:
    """``duration`` when it is a whole number of seconds within the cap; else one line saying what fits."""
    if not isinstance(duration.duration_s, int) or duration.duration_s <= 0:
        raise H3AppError(f"a ZeroGPU call cannot declare {duration.duration_s!r} seconds: this is a bug, report it.")
    if duration.quota_s > duration.cap_s:
        predicted = f"predicted {duration.predicted_s:.0f} s" if duration.predicted_s is not None else "allowance"
        raise H3AppError(
            f"this request would ask for {duration.quota_s} s of ZeroGPU quota ({duration.duration_s} s on the whole "
            f"card, {predicted} + margin), over the {duration.cap_s} s one call may ask for: {what_fits}.")
    return duration


def videos_per_day(video_s: float, duration: Duration, tier: str) -> int:
    """How many such videos a visitor of ``tier`` makes a day: each is charged its seconds × the size's factor, and
    a call starts only while the quota left covers what it requests (``spaces``' "N s requested vs. M s left")."""
    quota, charged = DAILY_QUOTA_S[tier], video_s * QUOTA_FACTOR[duration.size]
    if duration.quota_s > duration.cap_s or duration.quota_s > quota or charged <= 0:
        return 0
    return 1 + int((quota - duration.quota_s) // charged)


def gpu(fn: Callable[..., Any], duration: Callable[..., int]) -> Callable[..., Any]:
    """``fn`` as a ZeroGPU call (the whole card, ``duration(*args)`` seconds), the stand-in's forked call, or ``fn``
    itself (see the module docstring)."""
    home = mode()
    if home == SPACES:
        import spaces  # imported by app.py before anything initialises CUDA

        return spaces.GPU(fn, duration=duration, size=SIZE)
    if home == FORK:
        from .zero_gpu_fork import forked

        return forked(fn, duration)
    return fn


def import_spaces_first() -> bool:
    """On a ZeroGPU Space, import ``spaces`` now (it must come before anything initialises CUDA, and it patches
    torch so that CUDA is emulated outside decorated calls); True when it did."""
    if mode() != SPACES:
        return False
    import spaces  # noqa: F401

    return True


@contextlib.contextmanager
def outside_emulation() -> Iterator[None]:
    """On a ZeroGPU Space: torch without ``spaces``' CUDA emulation while the block runs (the judge's full-size
    rehearsals run on h3app's own fake CUDA, which the emulation's torch function mode would intercept: "Cannot copy
    out of meta tensor"), one block at a time; elsewhere nothing changes."""
    if mode() != SPACES:
        yield
        return
    from spaces.zero import torch as emulation  # spaces.zero.torch.patch/unpatch: what spaces' own child runs

    with _EMULATION:
        emulation.unpatch()
        try:
            yield
        finally:
            emulation.patch()


def outside_emulation_of(predict: Callable[[Any], Any] | None) -> Callable[[Any], Any] | None:
    """``predict`` (a time model) run :func:`outside_emulation` (None stays None)."""
    if predict is None or mode() != SPACES:
        return predict

    def predicted(request: Any) -> Any:
        with outside_emulation():
            return predict(request)

    return predicted
