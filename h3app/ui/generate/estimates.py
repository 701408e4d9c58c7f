"""One estimator for every time the page states before a click: Generate's line, the check's cost and the Grid's.

A request's seconds come, in this order of trust, from

1. **a run this server made at the same size** (workflow, canvas, frames, step cache): its measured seconds, scaled
   to the request's steps by the time model's own ratio (``Backend.predicted_time``: the plan's prediction), or by
   evaluations + one for the decode where there is no prediction;
2. **the time model, corrected by this server's runs**: the prediction × the median measured ÷ predicted of the
   latest runs (the time model plans the model's largest canvas and rates measured at start-up; the runs say what
   this machine does);
3. **the time model** alone, before any run.

Generate states one run, the check ``3`` runs + one denoising step (``Backend.check_cost``), the Grid its cells + one
no-LoRA baseline per seed; all three are worded here from one :class:`Estimate`, in one queued event
(``app_ui._wire_estimates``). The estimator learns from every generation the page or the API runs, from each
check's A run and from each grid cell (:meth:`Estimator.learn`). fl2va and ref2va are estimated at the request's
size before their inputs are uploaded (their conditioning inputs do not change the denoising's size here).
"""

from __future__ import annotations

import statistics
import threading
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from ...errors import H3AppError
from ...request import GenerationRequest
from ...rules.choices import T2VA
from ...rules.frames import RELEASED
from ...rules.steps import evaluations
from ..forms import GridForm, RequestForm
from ..presenters.visitor_words import counted
from .time_note import seconds_words, time_words, zero_gpu_words

if TYPE_CHECKING:
    from ...backend.grid import GridPlan
    from ...backend.limits import Limits
    from ...backend.service import Backend  # the one type the page holds the backend as (docs/architecture.md)

RECENT = 16  # runs the correction of the time model looks at
REMEMBERED = 64  # runs kept per server


class Ask:
    """The value of an ``estimate`` argument not given: the function asks the estimator itself."""


ASK = Ask()


@dataclass(frozen=True)
class RequestSize:
    """What a request's time depends on — the fields the time model reads (``hardware.estimate.planned``) — without
    the prompt or input files, so that fl2va and ref2va are sized before their inputs are uploaded."""

    workflow: str
    height: int | None
    width: int | None
    duration: float
    steps: int
    cache: str

    @property
    def key(self) -> tuple[Any, ...]:
        """Same key, same size: runs at another step count are scaled, not mixed."""
        return self.workflow, self.height, self.width, RELEASED.frames(self.duration), self.cache

    @classmethod
    def of(cls, request: GenerationRequest) -> RequestSize:
        return cls(request.workflow, request.height, request.width, float(request.duration), int(request.steps),
                   request.cache)


def sized(form: RequestForm, limits: Limits) -> RequestSize | None:
    """The size of the request ``form`` stands for, or None when its numbers are refused (the note under Steps says
    why). The workflow's inputs are not needed: a t2va request of the same numbers is checked."""
    try:
        request = replace(form, prompt="-", randomize=False, workflow=T2VA, first_frame=None, last_frame=None,
                          references=()).to_request()
        limits.check_canvas(request.height, request.width)
        limits.check_steps(request.steps)
        limits.frames.check_duration(request.duration)
    except H3AppError:
        return None
    return replace(RequestSize.of(request), workflow=form.workflow or T2VA)


@dataclass(frozen=True)
class Measured:
    size: RequestSize
    seconds: float
    predicted: float | None  # the time model's video_s for the same size, when there is one


@dataclass(frozen=True)
class Estimate:
    """Seconds of one generation of a size, how they were found (``source``), and the time model's prediction
    (its terms and $ for Generate's line; None without one)."""

    seconds: float
    source: str
    prediction: Mapping[str, Any] | None = None


class Estimator:
    """The estimates of one server (``predict``: ``Backend.predicted_time``). Thread-safe."""

    def __init__(self, predict: Callable[[Any], Mapping[str, Any] | None]) -> None:
        self.predict = predict
        self._runs: deque[Measured] = deque(maxlen=REMEMBERED)
        self._lock = threading.Lock()

    def prediction(self, size: RequestSize) -> Mapping[str, Any] | None:
        try:
            return self.predict(size)
        except Exception:  # a prediction that fails leaves the measured runs to speak; never the page's failure
            return None

    def learn(self, request: GenerationRequest, seconds: float | None, predicted: float | None | Ask = ASK) -> None:
        """A generation of ``request`` (a GenerationRequest) took ``seconds`` on this server; ``predicted``: the
        time model's seconds for it when the run recorded them (asked when not given)."""
        if not seconds or seconds <= 0:
            return
        size = RequestSize.of(request)
        if isinstance(predicted, Ask):
            prediction = self.prediction(size)
            predicted = prediction["video_s"] if prediction else None
        with self._lock:
            self._runs.append(Measured(size, float(seconds), predicted))

    def estimate(self, size: RequestSize) -> Estimate | None:
        """One generation of ``size`` (see the module docstring), or None with neither a run nor a prediction."""
        prediction = self.prediction(size)
        predicted = prediction["video_s"] if prediction else None
        with self._lock:
            runs = list(self._runs)
        same = [run for run in runs if run.size.key == size.key]
        if same:
            run = same[-1]
            if predicted and run.predicted:
                scale = predicted / run.predicted
            else:
                scale = (evaluations(size.steps) + 1) / (evaluations(run.size.steps) + 1)
            steps = f"{run.size.steps} steps" + ("" if run.size.steps == size.steps else ", scaled to these steps")
            return Estimate(run.seconds * scale, f"measured here: a run at this size took "
                                                 f"{seconds_words(run.seconds)} ({steps})", prediction)
        if predicted is None:
            return None
        ratios = [run.seconds / run.predicted for run in runs[-RECENT:] if run.predicted]
        if ratios:
            factor = statistics.median(ratios)
            return Estimate(predicted * factor, f"the time model × {factor:.2g}, this server's measured ÷ predicted "
                                                f"over {len(ratios)} run{'' if len(ratios) == 1 else 's'}", prediction)
        return Estimate(predicted, "the time model (no run on this server yet)", prediction)


_ESTIMATORS: weakref.WeakKeyDictionary[Any, Estimator] = weakref.WeakKeyDictionary()
_MADE = threading.Lock()


def estimator_for(backend: Backend) -> Estimator:
    """The one estimator of ``backend``'s server (its runs are this server's)."""
    with _MADE:
        if backend not in _ESTIMATORS:
            _ESTIMATORS[backend] = Estimator(lambda size: backend.predicted_time(size))
        return _ESTIMATORS[backend]


# ---------------------------------------------------------------------------------------------------- the words
def generate_line(estimate: Estimate | None) -> str:
    """Generate's line under the request: the time model's terms and $ when the estimate is its prediction, else
    the estimate and where it comes from; '' without one."""
    if estimate is None:
        return ""
    if estimate.prediction is not None and estimate.source.startswith("the time model ("):
        return time_words(estimate.prediction)
    text = f"⏱ **About {seconds_words(estimate.seconds)}** per video — {estimate.source}."
    usd = (estimate.prediction or {}).get("usd_per_video")
    if usd is not None and estimate.prediction and estimate.prediction.get("video_s"):
        text += f" · **${usd * estimate.seconds / estimate.prediction['video_s']:.4f}** per video"
    zerogpu = (estimate.prediction or {}).get("zerogpu")
    if zerogpu:  # ZeroGPU: the quota the call asks for (time_note.zero_gpu_words)
        text += zero_gpu_words(zerogpu)
    return text


def runs_line(runs: float, what: str, estimate: Estimate | None) -> str:
    """``about **12 s** (3 generations + 1 denoising step at 3.9 s each, measured here …)``."""
    if estimate is None:
        return f"{what} (time unknown: no prediction on this box and no run yet)"
    return (f"{what} — about **{seconds_words(runs * estimate.seconds)}** ({seconds_words(estimate.seconds)} per "
            f"generation: {estimate.source})")


def _asked(backend: Backend, request: RequestForm, estimate: Estimate | None | Ask) -> Estimate | None:
    if not isinstance(estimate, Ask):
        return estimate
    size = sized(request, backend.limits)
    return estimator_for(backend).estimate(size) if size is not None else None


def check_line(backend: Backend, request: RequestForm, estimate: Estimate | None | Ask = ASK) -> str:
    """The check's cost: its runs (``Backend.check_cost``: A, B and the fallback in full, the control one step)
    and their seconds at ``estimate`` (one generation of ``request``; asked when not given); '' while a request
    value is refused (the note under Steps says why, once)."""
    if sized(request, backend.limits) is None:
        return ""
    cost = backend.check_cost(replace(request, prompt="-", workflow=T2VA, first_frame=None, last_frame=None,
                                      references=()).to_request())
    runs = cost.full_runs + cost.control_steps / max(cost.steps_per_run, 1)
    what = (f"This check costs **{counted(cost.full_runs, 'generation')} + "
            f"{counted(cost.control_steps, 'denoising step')}** (A, B and the fallback in full; the control is one "
            "step)")
    return runs_line(runs, what, _asked(backend, request, estimate)) + "."


def grid_line(backend: Backend, plan: GridPlan, request: RequestForm | None = None,
              estimate: Estimate | None | Ask = ASK) -> str:
    """The Grid's cost: its cells (``GridPlan``) + one no-LoRA baseline per seed, and their seconds at
    ``estimate`` (one generation of ``request``, the model's default one when None; asked when not given)."""
    runs = plan.cells + len(plan.seeds)
    adapters = f"{counted(plan.adapters, 'adapter')} × " if getattr(plan, "adapters", 1) > 1 else ""  # rows
    what = (f"**{counted(plan.cells, 'cell')}** ({adapters}{counted(len(plan.alphas), 'alpha')} × "
            f"{counted(len(plan.strengths), 'scale')} × {counted(len(plan.seeds), 'seed')}) + "
            f"{counted(len(plan.seeds), 'no-LoRA baseline')} = {counted(runs, 'generation')}")
    asked = _asked(backend, request or RequestForm(steps=backend.defaults.steps), estimate)
    return runs_line(runs, what, asked) + "."


class ComparisonEstimates(Protocol):
    """What :func:`estimate_lines` asks of the comparisons' events (``compare.events.ComparisonEvents``)."""

    def check_estimate(self, request: RequestForm, estimate: Estimate | None | Ask = ASK) -> str: ...

    def estimate(self, grid: GridForm, request: RequestForm | None = None, estimate: Estimate | None | Ask = ASK
                 ) -> str: ...


def estimate_lines(backend: Backend, comparisons: ComparisonEstimates, request: RequestForm,
                   grid: GridForm) -> dict[str, str]:
    """The page's three estimates from one :class:`Estimate` of ``request``: ``generate`` (the line under the
    request), ``check`` (``ComparisonEvents.check_estimate``) and ``grid`` (``ComparisonEvents.estimate`` of the
    ``grid`` axes, a ``GridForm``)."""
    size = sized(request, backend.limits)
    estimate = estimator_for(backend).estimate(size) if size is not None else None
    return {"generate": generate_line(estimate), "check": comparisons.check_estimate(request, estimate),
            "grid": comparisons.estimate(grid, request, estimate)}
