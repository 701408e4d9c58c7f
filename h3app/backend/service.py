"""The backend the UI, the API and the CLI talk to: one loaded model, one worker, one adapter binder.

Every GPU-touching call becomes a worker job that carries its complete settings (request + adapters). Cheap,
model-free calls (listing a repo, reading a header) run on the caller's thread.
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ..adapters import source as sources
from ..adapters.source.limits import adapter_size_cap
from ..adapters.inspect import inspect_header
from ..adapters.known import registry_identity
from ..adapters.types import AdapterInfo
from ..errors import for_visitor
from ..lora.report import MatchReport
from ..model import repo
from ..model.loader import LoadedModel, LoadOptions, load_model
from ..rules.choices import T2VA
from ..rules.h3_modules import transformer_shapes
from ..rules.steps import evaluations
from ..settings import LoRASettings
from .adapter_binding import AdapterBinder, LoadedAdapter, SourcePolicy
from .admission import MAX_PENDING, Admission
from .equivalence import DEFAULT_A, DEFAULT_B, EquivalenceResult, run_equivalence
from .generation import GenerationRequest, GenerationResult, run_generation, save_result
from .grid import BASELINE_BYTES, Baselines, GridCell, GridPlan, plan_grid, run_grid
from .limits import Limits, model_limits
from .media import write_thumbnail
from .transformer_check import CheckSetting
from .worker import CLIENT_GONE, JobContext, JobHandle, Worker

DEMO_ADAPTERS_DIR = Path(__file__).resolve().parents[2] / "assets" / "adapters"
OUTPUT_KEEP_SECONDS = 3600
POLL_SECONDS = 0.25  # how often a waiting caller looks at progress and at its client


@dataclass(frozen=True)
class GenerationOutput:
    """A finished generation: mp4 + thumbnail paths, the settings JSON stored in the mp4, and the raw result."""

    video_path: str
    thumbnail_path: str
    settings: dict[str, Any]
    result: GenerationResult
    hide_paths: bool = False  # hosted: answers name files, never server folders

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {"out": shown(self.video_path, self.hide_paths), "thumbnail": shown(self.thumbnail_path, self.hide_paths),
                "seed": r.request.seed,
                "steps": r.request.steps, "evaluations": r.evaluations, "frames": r.frames, "fps": r.fps,
                "width": r.width, "height": r.height, "sample_rate": r.sample_rate,
                "audio_channels": int(r.audio.shape[0]), "hash": r.hash,
                "adapters": self.settings["adapters"], "seconds": round(r.seconds, 3)}


def shown(path: str, hide_paths: bool) -> str:
    """``path`` as an answer shows it: its file name on a hosted server (no server folders), else as is."""
    return Path(path).name if hide_paths else path


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


@dataclass(frozen=True)
class LoadResult:
    """An adapter fetched, normalised and bound: its header facts, where it came from, and the match report."""

    info: AdapterInfo
    provenance: dict[str, Any]
    report: MatchReport


class Backend:
    """Owns the model. ``hosted`` turns on the public-server rules (docs/security.md)."""

    def __init__(self, model: str = repo.TINY, options: LoadOptions | None = None, *, hosted: bool = False,
                 output_dir: str | Path | None = None, allowed_local_dirs: Sequence[str | Path] = (),
                 max_remote_bytes: int | None = None, cache_bytes: int | None = None, max_queue: int = 16,
                 max_download_cache_bytes: int | None = None, baseline_bytes: int = BASELINE_BYTES,
                 loaded: LoadedModel | None = None, parallel: Any = None) -> None:
        self.model: LoadedModel = loaded if loaded is not None else load_model(model, T2VA, options)
        self.hosted = hosted
        self.output_dir = Path(output_dir or Path(tempfile.gettempdir()) / "h3app-outputs")
        self.uploads_dir = self.output_dir / "uploads"
        self.uploads_dir.mkdir(parents=True, exist_ok=True)
        allowed = tuple(str(Path(p).resolve()) for p in (*(allowed_local_dirs or (DEMO_ADAPTERS_DIR,)),
                                                         self.uploads_dir))
        self.policy = SourcePolicy(hosted=hosted, allowed_local_dirs=allowed, max_remote_bytes=max_remote_bytes,
                                   unlisted_dirs=(str(self.uploads_dir.resolve()),),
                                   max_cache_bytes=max_download_cache_bytes,
                                   protected_repos=tuple(r for r in (self.model.location.repo_id,) if r))
        from ..lora.cache import AdapterCache

        cache = AdapterCache(cache_bytes) if cache_bytes is not None else None
        self.binder = AdapterBinder(self.model, policy=self.policy, cache=cache)
        self.worker = Worker(max_queue=max_queue, on_failure=lambda error: self.binder.reset())
        self.admission = Admission(max_pending=min(MAX_PENDING, max_queue))  # the UI's fair queue (hosted mode)
        self.parallel = parallel  # h3app.parallel.group.RankGroup when ranks share each job (docs/multi-gpu.md)
        if parallel is not None:
            from ..parallel.follower import bind

            bind(parallel, self)
        self._baselines = Baselines(baseline_bytes)
        self._limits: Limits | None = None
        self.last_seconds_per_run: float | None = None

    # ------------------------------------------------------------------------------------------ model-free
    @property
    def model_name(self) -> str:
        return self.model.name

    @property
    def limits(self) -> Limits:
        """The caps of the held model (tighter when hosted): canvas, steps, prompt tokens, grid cells."""
        if self._limits is None:
            self._limits = model_limits(self.model.pipeline(T2VA), hosted=self.hosted)
        return self._limits

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
        return sources.list_weight_files(source, revision, self.policy.token(token), **self._local_rule())

    def inspect(self, source: str, weight_name: str | None = None, revision: str | None = None,
                token: str | None = None, workflow: str = T2VA, qkv_layout: str = "auto") -> AdapterInfo:
        """Header only (remote: HTTP ranges), checked against the held model's shapes; no weights downloaded."""
        self.policy.check_source(source)
        ref = sources.parse_source(source, weight_name, revision, **self._local_rule())
        view = sources.read_header(ref, None, None, self.policy.token(token), **self._local_rule())  # ref has them
        partition = repo.partition_for(workflow)
        shapes = transformer_shapes(repo.read_transformer_config(str(self.model.location.folder), partition))
        repo_id, filename = registry_identity(str(ref.local_path or source), weight_name, ref.filename or view.name,
                                              repo_id=ref.repo_id)
        return inspect_header(view, shapes=shapes, repo_id=repo_id, filename=filename, qkv_layout=qkv_layout,
                              partition=partition)

    def _local_rule(self) -> dict[str, Any]:
        return {"allowed_local_dirs": list(self.policy.allowed_local_dirs)} if self.hosted else {}

    # ----------------------------------------------------------------------------------------- worker jobs
    def submit_load(self, settings: LoRASettings, workflow: str = T2VA, token: str | None = None) -> JobHandle:
        """Fetch (only that file), normalise and bind ``settings``' adapter; the job's result is a LoadResult."""

        def job(ctx: JobContext) -> LoadResult:
            ctx.set_phase("downloading")

            def downloaded(done: int, total: int | None) -> None:
                ctx.on_step(done, total or 0)
                if total is not None and done >= total:
                    ctx.set_phase("binding")

            loaded: LoadedAdapter = self.binder.apply([settings], workflow, token, progress=downloaded)[0]
            return LoadResult(info=loaded.adapter.info, provenance=loaded.provenance(self.hosted),
                              report=self.binder.report(settings, workflow))

        return self._submit(job, f"load {settings.source}", "submit_load", (settings, workflow, token), workflow)

    def submit_generate(self, request: GenerationRequest, adapters: Sequence[LoRASettings] = (),
                        token: str | None = None) -> JobHandle:
        """Apply exactly ``adapters`` (possibly none), generate, write the mp4; result: GenerationOutput."""
        adapters = tuple(adapters)
        self.check_request(request)

        def job(ctx: JobContext) -> GenerationOutput:
            ctx.set_phase("applying adapters")
            applied = self.binder.apply(adapters, request.workflow, token)
            ctx.set_phase("denoising")
            result = run_generation(self.model.pipeline(request.workflow), request, on_step=ctx.on_step,
                                    should_cancel=ctx.should_cancel)
            self.last_seconds_per_run = result.seconds
            ctx.set_phase("encoding mp4")
            return self._save(result, [a.provenance(self.hosted) for a in applied])

        return self._submit(job, "generate", "submit_generate", (request, adapters, token), request.workflow)

    def submit_equivalence(self, request: GenerationRequest, adapter: LoRASettings, a: CheckSetting = DEFAULT_A,
                           b: CheckSetting = DEFAULT_B, token: str | None = None) -> JobHandle:
        """A vs B vs fallback vs control through the full pipeline; result: EquivalenceResult."""
        self.check_request(request)

        def job(ctx: JobContext) -> EquivalenceResult:
            self.cleanup_outputs()
            result = run_equivalence(self.binder, request, adapter, a=a, b=b, output_dir=self.output_dir,
                                     token=token, on_step=ctx.on_step, should_cancel=ctx.should_cancel,
                                     on_phase=ctx.set_phase, hide_paths=self.hosted)
            self.last_seconds_per_run = result.seconds_per_run
            return result

        return self._submit(job, "equivalence", "submit_equivalence", (request, adapter, a, b, token),
                            request.workflow)

    def _submit(self, job: Callable[[JobContext], Any], label: str, method: str, args: tuple,
                workflow: str) -> JobHandle:
        """Queue ``job``. Parallel hook: with ranks, rank 0 announces ``method(*args)`` and every rank runs it in
        step (``h3app.parallel.lockstep``)."""
        if self.parallel is not None:
            from ..parallel.lockstep import JobCall, lockstep_job

            job = lockstep_job(self.parallel, self, JobCall(method, args, workflow), job)
        return self.worker.submit(job, label=label)

    def plan_grid(self, alphas: Sequence[float | None], strengths: Sequence[float],
                  seeds: Sequence[int]) -> GridPlan:
        plan = plan_grid(alphas, strengths, seeds, self.last_seconds_per_run)
        self.limits.check_grid(plan.cells)
        return plan

    def grid(self, request: GenerationRequest, adapter: LoRASettings, plan: GridPlan, token: str | None = None,
             on_step: Callable[[int, int], None] | None = None,
             on_handle: Callable[[JobHandle], None] | None = None,
             abandoned: Callable[[], bool] | None = None) -> Iterator[GridCell]:
        """Run the grid as one worker job and yield its cells as they finish (errors re-raised here).
        ``on_handle`` receives the job's handle as soon as it is queued (to cancel it); ``abandoned()`` is polled
        while waiting and cancels the job when it says the client went away; so does closing this generator early."""
        self.check_request(request)
        self.limits.check_grid(plan.cells)
        cells: queue.Queue[Any] = queue.Queue()
        done = object()

        def job(ctx: JobContext) -> int:
            count = 0
            for cell in run_grid(self.binder, request, adapter, plan, output_dir=self.output_dir,
                                 baselines=self._baselines, token=token, on_step=ctx.on_step,
                                 should_cancel=ctx.should_cancel, hide_paths=self.hosted):
                cells.put(cell)
                count += 1
            return count

        handle = self._submit(job, "grid", "grid", (request, adapter, plan, token), request.workflow)
        if on_handle is not None:
            on_handle(handle)
        watcher = _Forwarder(handle, cells, done, on_step)
        watcher.start()
        try:
            while True:
                try:
                    item = cells.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    handle.cancel_if(abandoned)
                    continue
                if item is done:
                    self._result(handle)  # re-raise the job's error, if any
                    return
                yield item
        finally:
            if not handle.done:  # the caller stopped reading (a closed generator): nobody waits for the rest
                handle.cancel(CLIENT_GONE)

    def run(self, handle: JobHandle, on_step: Callable[[int, int], None] | None = None,
            on_phase: Callable[[str], None] | None = None, abandoned: Callable[[], bool] | None = None) -> Any:
        """Wait for ``handle`` while forwarding its progress; return its result or raise its error.
        ``abandoned()`` (the UI's check of its Gradio event, ``h3app.ui.client_gone``) is polled while waiting: when it
        says nobody waits any more, the job is cancelled at its next denoising step."""
        last = None
        while not handle.done:
            handle.wait_for_change(POLL_SECONDS)
            handle.cancel_if(abandoned)
            progress = handle.progress
            if on_phase is not None and progress.phase != (last.phase if last else None):
                on_phase(progress.phase if progress.phase != "queued" else f"queued (position {progress.position})")
            if on_step is not None and progress.total and (last is None or progress.done != last.done):
                on_step(progress.done, progress.total)
            last = progress
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
                 token: str | None = None, on_step: Callable[[int, int], None] | None = None) -> GenerationOutput:
        return self.run(self.submit_generate(request, adapters, token), on_step)

    def load(self, settings: LoRASettings, workflow: str = T2VA, token: str | None = None) -> LoadResult:
        return self.run(self.submit_load(settings, workflow, token))

    def check_equivalence(self, request: GenerationRequest, adapter: LoRASettings, a: CheckSetting = DEFAULT_A,
                          b: CheckSetting = DEFAULT_B, token: str | None = None,
                          on_step: Callable[[int, int], None] | None = None) -> EquivalenceResult:
        return self.run(self.submit_equivalence(request, adapter, a, b, token), on_step)

    # ------------------------------------------------------------------------------------------------ files
    def _save(self, result: GenerationResult, adapters: list[dict[str, Any]]) -> GenerationOutput:
        self.cleanup_outputs()
        settings = {"h3app": "generate", "model": self.model.name, "model_commit": self.model.location.commit,
                    "request": result.request.to_json(self.hosted), "adapters": adapters, "hash": result.hash}
        stem = self.output_dir / uuid.uuid4().hex
        video = save_result(result, stem.with_suffix(".mp4"), settings)
        thumb = write_thumbnail(stem.with_suffix(".png"), result.video)
        return GenerationOutput(str(video), str(thumb), settings, result, hide_paths=self.hosted)

    def cleanup_outputs(self, keep_seconds: float = OUTPUT_KEEP_SECONDS) -> int:
        """Delete output files older than ``keep_seconds``; returns how many were removed."""
        cutoff = time.time() - keep_seconds
        removed = 0
        for path in [*self.output_dir.iterdir(), *self.uploads_dir.iterdir()]:
            try:
                if path == self.uploads_dir or path.lstat().st_mtime >= cutoff:
                    continue
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            except FileNotFoundError:  # removed by someone else meanwhile
                continue
            removed += 1
        return removed

    def close(self) -> None:
        self.worker.close()


class _Forwarder:
    """Moves a grid job's progress to the caller's ``on_step`` and marks the end of its cell stream."""

    def __init__(self, handle: JobHandle, cells: queue.Queue, done: object,
                 on_step: Callable[[int, int], None] | None) -> None:
        import threading

        self._thread = threading.Thread(target=self._loop, args=(handle, cells, done, on_step), daemon=True)

    def start(self) -> None:
        self._thread.start()

    @staticmethod
    def _loop(handle: JobHandle, cells: queue.Queue, done: object, on_step: Callable[[int, int], None] | None) -> None:
        while not handle.done:
            handle.wait_for_change(0.25)
            progress = handle.progress
            if on_step is not None and progress.total:
                on_step(progress.done, progress.total)
        cells.put(done)


def hosted_from_env() -> bool:
    """Public hosted mode: ``H3APP_HOSTED=1``, on by default on a Hugging Face Space (``SPACE_ID`` set)."""
    return os.environ.get("H3APP_HOSTED", "1" if os.environ.get("SPACE_ID") else "0") == "1"


def backend_from_env(model: str | None = None, options: LoadOptions | None = None, parallel: Any = None) -> Backend:
    """The app's backend configured from environment variables (README lists them); ``parallel``: the rank group
    (h3app.parallel) when several ranks share each job."""
    hosted = hosted_from_env()
    max_mb = os.environ.get("H3APP_MAX_ADAPTER_MB")
    cache_gb = os.environ.get("H3APP_MAX_DOWNLOAD_CACHE_GB")
    return Backend(model or os.environ.get("H3APP_MODEL", repo.TINY), options, hosted=hosted,
                   output_dir=os.environ.get("H3APP_OUTPUT_DIR"),
                   max_remote_bytes=adapter_size_cap(max_mb, hosted),
                   max_download_cache_bytes=int(float(cache_gb) * 1024**3) if cache_gb else (
                       20 * 1024**3 if hosted else None), parallel=parallel)


__all__ = ["Backend", "GenerationOutput", "LoadResult", "backend_from_env"]
