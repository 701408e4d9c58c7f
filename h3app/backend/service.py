"""The backend the UI, the API and the CLI talk to: one loaded model, one worker, one adapter binder.

Every GPU-touching call becomes a worker job, a value that carries its complete settings (request + adapters;
``jobs``); the ``submit_*`` methods build one and queue it (:meth:`Backend.submit`). Cheap,
model-free calls (listing a repo, reading a header) run on the caller's thread.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..adapters import source as sources
from ..adapters.source.limits import adapter_size_cap
from ..adapters.types import AdapterInfo
from ..errors import for_visitor
from ..hosting.admission import Admission
from ..hosting.limits import LIMITS
from ..model import repo
from ..model.loader import LoadedModel, LoadOptions, load_model
from ..rules.check_pair import DEFAULT_A, DEFAULT_B, CheckSetting
from ..rules.choices import T2VA
from ..rules.request_defaults import RequestDefaults, defaults_for
from ..rules.steps import evaluations
from ..settings import LoRASettings
from . import zero_gpu
from .adapter_binding import AdapterBinder, SourcePolicy
from .equivalence import EquivalenceResult
from .generation import GenerationRequest
from .grid import BASELINE_BYTES, CELL_BYTES, Baselines, GridCell, GridPlan, plan_grid
from .grid_rows import GridRow, expand_rows
from .jobs import (
    NO_SINKS,
    EquivalenceJob,
    GenerateJob,
    GridJob,
    Job,
    JobWrapper,
    LoadJob,
    LoadResult,
    Run,
    Sinks,
    alone,
)
from .limits import Limits, model_limits
from .outputs import OUTPUT_KEEP_SECONDS, GenerationOutput, Outputs, remove_older
from .preview import PreviewBoard
from .worker import JobContext, JobHandle, Worker, stream, wait

DEMO_ADAPTERS_DIR = Path(__file__).resolve().parents[2] / "assets" / "adapters"


@dataclass(frozen=True)
class CheckCost:
    """What a full-mode equivalence check costs before it starts: ``full_runs`` whole pipeline runs plus
    ``control_steps`` denoising steps, at ``seconds_per_run`` (the last measured generation; None before any)."""

    full_runs: int
    control_steps: int
    steps_per_run: int
    seconds_per_run: float | None

    @property
    def estimated_seconds(self) -> float | None:
        if self.seconds_per_run is None:
            return None
        return self.seconds_per_run * (self.full_runs + self.control_steps / max(self.steps_per_run, 1))

    def describe(self) -> str:
        runs = f"{self.full_runs} generations + {self.control_steps} denoising step"
        if self.estimated_seconds is None:
            return f"{runs} (run one generation first for a time estimate)"
        return f"{runs} ≈ {self.estimated_seconds:.0f} s ({self.seconds_per_run:.1f} s per generation)"


log = logging.getLogger(__name__)


class Backend:
    """Owns the model. ``hosted`` turns on the public-server rules (docs/security.md). Every job is a value
    (``jobs``); ``wrap_job`` wraps it before it is queued (:func:`~h3app.backend.jobs.alone` on one rank; with
    several ranks the entry point injects ``h3app.parallel``'s lockstep wrapper, docs/multi-gpu.md; under ZeroGPU
    ``gpu_calls.GpuCalls``)."""

    def __init__(self, model: str = repo.TINY, options: LoadOptions | None = None, *, hosted: bool = False,
                 output_dir: str | Path | None = None, allowed_local_dirs: Sequence[str | Path] = (),
                 max_remote_bytes: int | None = None, cache_bytes: int | None = None,
                 max_queue: int = LIMITS.worker_line,
                 max_download_cache_bytes: int | None = None, baseline_bytes: int = BASELINE_BYTES,
                 loaded: LoadedModel | None = None) -> None:
        self.model: LoadedModel = loaded if loaded is not None else load_model(model, T2VA, options)
        self.hosted = hosted
        self.output_dir = Path(output_dir or Path(tempfile.gettempdir()) / "h3app-outputs")
        self.uploads_dir = self.output_dir / "uploads"
        self.uploads_dir.mkdir(parents=True, exist_ok=True)
        self.policy = _source_policy(self.model, hosted, self.uploads_dir, allowed_local_dirs, max_remote_bytes,
                                     max_download_cache_bytes)
        from ..lora.cache import AdapterCache

        cache = AdapterCache(cache_bytes) if cache_bytes is not None else None
        self.binder = AdapterBinder(self.model, policy=self.policy, cache=cache)
        self.worker = Worker(max_queue=max_queue, on_failure=lambda error: self.binder.reset())
        self.admission = Admission(max_pending=min(LIMITS.gpu_pending, max_queue))  # hosting.gpu_gate (hosted mode)
        self.wrap_job: JobWrapper = alone  # every job as it is; parallel.follower.bind puts Lockstep here
        if zero_gpu.mode() is not None:  # ZeroGPU or its stand-in: every job one self-contained GPU call
            from .gpu_calls import GpuCalls, duration_for

            self.wrap_job = GpuCalls(self, functools.partial(duration_for, self))
        self.baselines = Baselines(baseline_bytes)  # a grid's no-LoRA runs, by request and seed
        self.cells = Baselines(CELL_BYTES)  # the grid's cells: one computed before is served, not run again
        self._limits: Limits | None = None
        self.last_seconds_per_run: float | None = None
        # GenerationRequest → the plan's prediction on this box (``hardware.estimate.TimeModel``, given by app.py;
        # None: no prediction shown). The backend does not import hardware/: the judge imports the backend.
        self.time_model: Callable[[GenerationRequest], dict[str, Any] | None] | None = None

    # ------------------------------------------------------------------------------------------ model-free
    @property
    def model_name(self) -> str:
        return self.model.name

    @property
    def defaults(self) -> RequestDefaults:
        """The held model's request defaults (``rules.request_defaults``): the tiny checkpoint's, else the full
        model's."""
        tiny = self.model.location.folder.resolve() == repo.TINY_DIR.resolve()
        return defaults_for(repo.TINY if tiny else self.model.name)

    @property
    def limits(self) -> Limits:
        """The caps of the held model (tighter when hosted): canvas, steps, prompt tokens, grid cells."""
        if self._limits is None:
            self._limits = model_limits(self.model.pipeline(T2VA), hosted=self.hosted)
        return self._limits

    def hold_to(self, max_seconds: float, max_pixels: int) -> None:
        """Keep every request within what this box holds (the plan's limits, given by ``app.py``)."""
        self._limits = self.limits.held_to(max_seconds, max_pixels)

    def predicted_time(self, request: GenerationRequest) -> dict[str, Any] | None:
        """The plan's prediction of ``request`` on this box (``video_s``, its terms, ``usd_per_video``), or None.
        Under ZeroGPU also ``zerogpu``: what its call declares (``zero_gpu.declared``: the quota it asks for)."""
        predicted = self.time_model(request) if self.time_model is not None else None
        if predicted and zero_gpu.mode() is not None and predicted.get("video_s") is not None:
            predicted = {**predicted, "zerogpu": zero_gpu.declared(float(predicted["video_s"])).to_json()}
        return predicted

    def predicted_or_none(self, request: GenerationRequest) -> dict[str, Any] | None:
        """:meth:`predicted_time` for a run's record: a prediction that fails is logged and left out, never the
        run's failure."""
        try:
            return self.predicted_time(request)
        except Exception:  # a prediction must never fail the run: the run goes on, the log keeps why
            log.exception("time prediction failed; the run's settings carry no predicted time")
            return None

    def check_request(self, request: GenerationRequest) -> None:
        """Refuse, before anything is queued, a request over the model's caps (one line naming the limit)."""
        self.limits.check_request(request, self.model.components.get("tokenizer"))

    def check_cost(self, request: GenerationRequest) -> CheckCost:
        """What :meth:`submit_equivalence` will cost for ``request``: A, B and the fallback as full runs, the
        determinism control as one denoising step; seconds from the last measured generation."""
        return CheckCost(full_runs=3, control_steps=1, steps_per_run=max(evaluations(request.steps), 1),
                         seconds_per_run=self.last_seconds_per_run)

    def demo_adapters(self) -> list[str]:
        """Paths of the demo adapters shipped with the app (files and PEFT folders)."""
        if not DEMO_ADAPTERS_DIR.is_dir():
            return []
        return sorted(str(p) for p in DEMO_ADAPTERS_DIR.iterdir() if p.suffix == ".safetensors" or p.is_dir())

    def list_weights(self, source: str, revision: str | None = None, token: str | None = None
                     ) -> list[sources.WeightFile]:
        self.policy.check_source(source)
        return sources.list_weight_files(source, revision, self.policy.token(token), **self.policy.local_rule())

    def inspect(self, source: str, weight_name: str | None = None, revision: str | None = None,
                token: str | None = None, workflow: str = T2VA, qkv_layout: str = "auto",
                skip_parts: tuple[str, ...] = ()) -> AdapterInfo:
        """Header only (remote: HTTP ranges), checked against the held model's shapes; no weights downloaded."""
        return self.policy.inspect(str(self.model.location.folder), source, weight_name, revision, token, workflow,
                                   qkv_layout, skip_parts)

    # ----------------------------------------------------------------------------------------- worker jobs
    def submit(self, job: Job, sinks: Sinks = NO_SINKS) -> JobHandle:
        """Queue ``job`` (a ``jobs`` value) through ``wrap_job``; ``sinks``: the caller's board and ``on_cell``,
        which stay in this process."""
        here: Run = functools.partial(_run_here, job, self, sinks)
        return self.worker.submit(self.wrap_job(job, sinks, here), label=job.label)

    def submit_load(self, settings: LoRASettings, workflow: str = T2VA, token: str | None = None) -> JobHandle:
        """Fetch (only that file), normalise and bind ``settings``' adapter; the job's result is a LoadResult."""
        return self.submit(LoadJob(settings, workflow, token))

    def submit_generate(self, request: GenerationRequest, adapters: Sequence[LoRASettings] = (),
                        token: str | None = None, previews: PreviewBoard | None = None) -> JobHandle:
        """Apply exactly ``adapters`` (possibly none), generate, write the mp4; result: GenerationOutput.
        ``previews``: the caller's board for a preview after every evaluation (this rank's; other ranks run none)."""
        self.check_request(request)
        return self.submit(GenerateJob(request, tuple(adapters), token), Sinks(previews))

    def submit_equivalence(self, request: GenerationRequest, adapter: LoRASettings, a: CheckSetting = DEFAULT_A,
                           b: CheckSetting = DEFAULT_B, token: str | None = None,
                           low_rank_only: bool = False, previews: PreviewBoard | None = None) -> JobHandle:
        """A vs B vs fallback vs control through the full pipeline; result: EquivalenceResult. ``low_rank_only``: B
        rescales only the low-rank parts (an adapter's exact deltas stay at A's strength). ``previews``: columns
        ``A``, ``B`` and ``fallback`` on the caller's board."""
        self.check_request(request)
        return self.submit(EquivalenceJob(request, adapter, a, b, token, low_rank_only), Sinks(previews))

    def plan_grid(self, alphas: Sequence[float | None], strengths: Sequence[float],
                  seeds: Sequence[int], adapters: int = 1) -> GridPlan:
        plan = plan_grid(alphas, strengths, seeds, self.last_seconds_per_run, adapters)
        self.limits.check_grid(plan.cells, plan.adapters)
        return plan

    def grid_rows(self, adapters: Sequence[LoRASettings], token: str | None = None) -> list[GridRow]:
        """The grid's adapter rows: a glob weight name (``*.safetensors``) expands into its folder's or repo's files
        in training order (headers only); refused in one line past the server's row limit."""
        return expand_rows(self.policy, adapters, token, self.limits.max_grid_rows)

    def submit_grid(self, request: GenerationRequest, adapter: LoRASettings | Sequence[GridRow], plan: GridPlan,
                    token: str | None = None, on_cell: Callable[[GridCell], None] | None = None,
                    previews: PreviewBoard | None = None) -> JobHandle:
        """Run the grid as one worker job; ``on_cell`` receives each cell as it finishes; result: the cell count.
        ``previews``: one column per cell (and per baseline) on the caller's board (``grid.cell_name``)."""
        self.check_request(request)
        self.limits.check_grid(plan.cells, plan.adapters)
        rows = adapter if isinstance(adapter, LoRASettings) else tuple(adapter)
        return self.submit(GridJob(request, rows, plan, token), Sinks(previews, on_cell))

    def grid(self, request: GenerationRequest, adapter: LoRASettings | Sequence[GridRow], plan: GridPlan,
             token: str | None = None,
             on_step: Callable[[int, int], None] | None = None,
             on_handle: Callable[[JobHandle], None] | None = None,
             abandoned: Callable[[], bool] | None = None, previews: PreviewBoard | None = None) -> Iterator[GridCell]:
        """Yield the grid's cells as they finish (errors re-raised here). ``on_handle`` receives the job's handle as
        soon as it is queued (to cancel it); ``abandoned()`` is polled while waiting and cancels the job when it says
        the client went away; so does closing this generator early."""
        cells: queue.Queue[GridCell] = queue.Queue()
        handle = self.submit_grid(request, adapter, plan, token, on_cell=cells.put, previews=previews)
        if on_handle is not None:
            on_handle(handle)
        yield from stream(handle, cells, on_step, abandoned)
        self._result(handle)  # re-raise the job's error, if any

    def run(self, handle: JobHandle, on_step: Callable[[int, int], None] | None = None,
            on_phase: Callable[[str], None] | None = None, abandoned: Callable[[], bool] | None = None) -> Any:
        """Wait for ``handle`` while forwarding its progress (``worker.wait``); return its result or raise its error."""
        wait(handle, on_step, on_phase, abandoned)
        return self._result(handle)

    def _result(self, handle: JobHandle) -> Any:
        """The job's result; its error as raised, except that a hosted server answers an unexpected one with one
        generic line (the details go to the server log)."""
        try:
            return handle.result()
        except Exception as error:
            if self.hosted:
                raise for_visitor(error, f"job {handle.id} ({handle.label})") from None
            raise

    # Convenience for scripts and tests: submit and wait.
    def generate(self, request: GenerationRequest, adapters: Sequence[LoRASettings] = (),
                 token: str | None = None, on_step: Callable[[int, int], None] | None = None,
                 previews: PreviewBoard | None = None) -> GenerationOutput:
        return self.run(self.submit_generate(request, adapters, token, previews), on_step)

    def load(self, settings: LoRASettings, workflow: str = T2VA, token: str | None = None) -> LoadResult:
        return self.run(self.submit_load(settings, workflow, token))

    def check_equivalence(self, request: GenerationRequest, adapter: LoRASettings, a: CheckSetting = DEFAULT_A,
                          b: CheckSetting = DEFAULT_B, token: str | None = None,
                          on_step: Callable[[int, int], None] | None = None,
                          low_rank_only: bool = False, previews: PreviewBoard | None = None) -> EquivalenceResult:
        return self.run(self.submit_equivalence(request, adapter, a, b, token, low_rank_only, previews), on_step)

    # ------------------------------------------------------------------------------------------------ files
    @property
    def outputs(self) -> Outputs:
        """The output folder; a hosted server's mp4s record local files by name."""
        return Outputs(self.output_dir, self.hosted)

    def cleanup_outputs(self, keep_seconds: float = OUTPUT_KEEP_SECONDS) -> int:
        """Delete output files and uploads older than ``keep_seconds``; returns how many were removed."""
        return remove_older([self.output_dir, self.uploads_dir], keep_seconds, keep=self.uploads_dir)

    def close(self) -> None:
        self.worker.close()


def _source_policy(model: LoadedModel, hosted: bool, uploads_dir: Path, allowed_local_dirs: Sequence[str | Path],
                   max_remote_bytes: int | None, max_cache_bytes: int | None) -> SourcePolicy:
    """Which adapter sources the server accepts: local files only in the allowed folders (the demo adapters by
    default) and the uploads folder (never listed), the model's own repo protected from the download cache's trim."""
    allowed = tuple(str(Path(p).resolve()) for p in (*(allowed_local_dirs or (DEMO_ADAPTERS_DIR,)), uploads_dir))
    return SourcePolicy(hosted=hosted, allowed_local_dirs=allowed, max_remote_bytes=max_remote_bytes,
                        unlisted_dirs=(str(uploads_dir.resolve()),), max_cache_bytes=max_cache_bytes,
                        protected_repos=tuple(r for r in (model.location.repo_id,) if r))


def hosted_from_env() -> bool:
    """Public hosted mode: ``H3APP_HOSTED=1``, on by default on a Hugging Face Space (``SPACE_ID`` set)."""
    return os.environ.get("H3APP_HOSTED", "1" if os.environ.get("SPACE_ID") else "0") == "1"


def backend_from_env(model: str | None = None, options: LoadOptions | None = None) -> Backend:
    """The app's backend configured from environment variables (README lists them)."""
    hosted = hosted_from_env()
    max_mb = os.environ.get("H3APP_MAX_ADAPTER_MB")
    return Backend(model or os.environ.get("H3APP_MODEL", repo.TINY), options, hosted=hosted,
                   output_dir=os.environ.get("H3APP_OUTPUT_DIR"),
                   max_remote_bytes=adapter_size_cap(max_mb, hosted),
                   max_download_cache_bytes=LIMITS.download_cache(hosted))


def _run_here(job: Job, backend: Backend, sinks: Sinks, ctx: JobContext) -> Any:
    """``job`` run on this process's ``backend``: what a job wrapper runs here (``jobs.JobWrapper``)."""
    return job.run(ctx, backend, sinks)


__all__ = ["Backend", "GenerationOutput", "LoadResult", "backend_from_env"]
