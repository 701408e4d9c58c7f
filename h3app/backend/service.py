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
from ..adapters.inspect import inspect_header
from ..adapters.known import registry_identity
from ..adapters.types import AdapterInfo
from ..lora.report import MatchReport
from ..model import repo
from ..model.loader import LoadedModel, LoadOptions, load_model
from ..rules.h3_modules import transformer_shapes
from ..settings import LoRASettings
from .adapter_binding import AdapterBinder, LoadedAdapter, SourcePolicy
from .equivalence import DEFAULT_A, DEFAULT_B, EquivalenceResult, run_equivalence
from .generation import GenerationRequest, GenerationResult, run_generation, save_result
from .grid import GridCell, GridPlan, plan_grid, run_grid
from .media import write_thumbnail
from .transformer_check import CheckSetting
from .worker import JobContext, JobHandle, Worker

DEMO_ADAPTERS_DIR = Path(__file__).resolve().parents[2] / "assets" / "adapters"
OUTPUT_KEEP_SECONDS = 3600


@dataclass(frozen=True)
class GenerationOutput:
    """A finished generation: mp4 + thumbnail paths, the settings JSON stored in the mp4, and the raw result."""

    video_path: str
    thumbnail_path: str
    settings: dict[str, Any]
    result: GenerationResult

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {"out": self.video_path, "thumbnail": self.thumbnail_path, "seed": r.request.seed,
                "steps": r.request.steps, "evaluations": r.evaluations, "frames": r.frames, "fps": 24,
                "width": r.width, "height": r.height, "sample_rate": r.sample_rate,
                "audio_channels": int(r.audio.shape[0]), "hash": r.hash,
                "adapters": self.settings["adapters"], "seconds": round(r.seconds, 3)}


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
                 max_download_cache_bytes: int | None = None,
                 loaded: LoadedModel | None = None) -> None:
        self.model: LoadedModel = loaded if loaded is not None else load_model(model, "t2va", options)
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
        self._baselines: dict[str, GenerationResult] = {}
        self.last_seconds_per_run: float | None = None

    # ------------------------------------------------------------------------------------------ model-free
    @property
    def model_name(self) -> str:
        return self.model.name

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
                token: str | None = None, workflow: str = "t2va", qkv_layout: str = "auto") -> AdapterInfo:
        """Header only (remote: HTTP ranges), checked against the held model's shapes; no weights downloaded."""
        self.policy.check_source(source)
        ref = sources.parse_source(source, weight_name, revision, **self._local_rule())
        view = sources.read_header(ref, None, None, self.policy.token(token), **self._local_rule())  # ref has them
        partition = repo.partition_for(workflow)
        shapes = transformer_shapes(repo.read_transformer_config(str(self.model.location.folder), partition))
        repo_id, filename = ref.repo_id, ref.filename or view.name
        if repo_id is None:  # a local file may still be a known one (e.g. inside a Hugging Face cache)
            repo_id, filename = registry_identity(str(ref.local_path or source), weight_name, view.name)
        return inspect_header(view, shapes=shapes, repo_id=repo_id, filename=filename, qkv_layout=qkv_layout,
                              partition=partition)

    def _local_rule(self) -> dict[str, Any]:
        return {"allowed_local_dirs": list(self.policy.allowed_local_dirs)} if self.hosted else {}

    # ----------------------------------------------------------------------------------------- worker jobs
    def submit_load(self, settings: LoRASettings, workflow: str = "t2va", token: str | None = None) -> JobHandle:
        """Fetch (only that file), normalise and bind ``settings``' adapter; the job's result is a LoadResult."""

        def job(ctx: JobContext) -> LoadResult:
            ctx.set_phase("downloading")
            self.binder.load(settings, workflow, token, progress=ctx.on_step)  # with progress; apply then hits the cache
            ctx.set_phase("binding")
            loaded: LoadedAdapter = self.binder.apply([settings], workflow, token)[0]
            return LoadResult(info=loaded.adapter.info, provenance=loaded.provenance(),
                              report=self.binder.report(settings, workflow))

        return self.worker.submit(job, label=f"load {settings.source}")

    def submit_generate(self, request: GenerationRequest, adapters: Sequence[LoRASettings] = (),
                        token: str | None = None) -> JobHandle:
        """Apply exactly ``adapters`` (possibly none), generate, write the mp4; result: GenerationOutput."""
        adapters = tuple(adapters)

        def job(ctx: JobContext) -> GenerationOutput:
            ctx.set_phase("applying adapters")
            applied = self.binder.apply(adapters, request.workflow, token)
            ctx.set_phase("denoising")
            result = run_generation(self.model.pipeline(request.workflow), request, on_step=ctx.on_step,
                                    should_cancel=ctx.should_cancel)
            self.last_seconds_per_run = result.seconds
            ctx.set_phase("encoding mp4")
            return self._save(result, [a.provenance() for a in applied])

        return self.worker.submit(job, label="generate")

    def submit_equivalence(self, request: GenerationRequest, adapter: LoRASettings, a: CheckSetting = DEFAULT_A,
                           b: CheckSetting = DEFAULT_B, token: str | None = None) -> JobHandle:
        """A vs B vs fallback vs control through the full pipeline; result: EquivalenceResult."""

        def job(ctx: JobContext) -> EquivalenceResult:
            self.cleanup_outputs()
            return run_equivalence(self.binder, request, adapter, a=a, b=b, output_dir=self.output_dir,
                                   token=token, on_step=ctx.on_step, should_cancel=ctx.should_cancel,
                                   on_phase=ctx.set_phase)

        return self.worker.submit(job, label="equivalence")

    def plan_grid(self, alphas: Sequence[float | None], strengths: Sequence[float],
                  seeds: Sequence[int]) -> GridPlan:
        return plan_grid(alphas, strengths, seeds, self.last_seconds_per_run)

    def grid(self, request: GenerationRequest, adapter: LoRASettings, plan: GridPlan, token: str | None = None,
             on_step: Callable[[int, int], None] | None = None,
             on_handle: Callable[[JobHandle], None] | None = None) -> Iterator[GridCell]:
        """Run the grid as one worker job and yield its cells as they finish (errors re-raised here).
        ``on_handle`` receives the job's handle as soon as it is queued (to cancel it)."""
        cells: queue.Queue[Any] = queue.Queue()
        done = object()

        def job(ctx: JobContext) -> int:
            count = 0
            for cell in run_grid(self.binder, request, adapter, plan, output_dir=self.output_dir,
                                 baselines=self._baselines, token=token, on_step=ctx.on_step,
                                 should_cancel=ctx.should_cancel):
                cells.put(cell)
                count += 1
            return count

        handle = self.worker.submit(job, label="grid")
        if on_handle is not None:
            on_handle(handle)
        watcher = _Forwarder(handle, cells, done, on_step)
        watcher.start()
        while True:
            item = cells.get()
            if item is done:
                handle.result()  # re-raise the job's error, if any
                return
            yield item

    def run(self, handle: JobHandle, on_step: Callable[[int, int], None] | None = None,
            on_phase: Callable[[str], None] | None = None) -> Any:
        """Wait for ``handle`` while forwarding its progress; return its result or raise its error."""
        last = None
        while not handle.done:
            handle.wait_for_change(0.25)
            progress = handle.progress
            if on_phase is not None and progress.phase != (last.phase if last else None):
                on_phase(progress.phase if progress.phase != "queued" else f"queued (position {progress.position})")
            if on_step is not None and progress.total and (last is None or progress.done != last.done):
                on_step(progress.done, progress.total)
            last = progress
        return handle.result()

    # Convenience for scripts and tests: submit and wait.
    def generate(self, request: GenerationRequest, adapters: Sequence[LoRASettings] = (),
                 token: str | None = None, on_step: Callable[[int, int], None] | None = None) -> GenerationOutput:
        return self.run(self.submit_generate(request, adapters, token), on_step)

    def load(self, settings: LoRASettings, workflow: str = "t2va", token: str | None = None) -> LoadResult:
        return self.run(self.submit_load(settings, workflow, token))

    def check_equivalence(self, request: GenerationRequest, adapter: LoRASettings, a: CheckSetting = DEFAULT_A,
                          b: CheckSetting = DEFAULT_B, token: str | None = None,
                          on_step: Callable[[int, int], None] | None = None) -> EquivalenceResult:
        return self.run(self.submit_equivalence(request, adapter, a, b, token), on_step)

    # ------------------------------------------------------------------------------------------------ files
    def _save(self, result: GenerationResult, adapters: list[dict[str, Any]]) -> GenerationOutput:
        self.cleanup_outputs()
        settings = {"h3app": "generate", "model": self.model.name, "model_commit": self.model.location.commit,
                    "request": result.request.to_json(), "adapters": adapters, "hash": result.hash}
        stem = self.output_dir / uuid.uuid4().hex
        video = save_result(result, stem.with_suffix(".mp4"), settings)
        thumb = write_thumbnail(stem.with_suffix(".png"), result.video)
        return GenerationOutput(str(video), str(thumb), settings, result)

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


def backend_from_env(model: str | None = None, options: LoadOptions | None = None) -> Backend:
    """The app's backend configured from environment variables (README lists them)."""
    from ..hardware.preflight import check_before_download

    check_before_download(model or os.environ.get("H3APP_MODEL", repo.TINY), options or LoadOptions())
    hosted = os.environ.get("H3APP_HOSTED", "1" if os.environ.get("SPACE_ID") else "0") == "1"
    max_mb = os.environ.get("H3APP_MAX_ADAPTER_MB")
    cache_gb = os.environ.get("H3APP_MAX_DOWNLOAD_CACHE_GB")
    return Backend(model or os.environ.get("H3APP_MODEL", repo.TINY), options, hosted=hosted,
                   output_dir=os.environ.get("H3APP_OUTPUT_DIR"),
                   max_remote_bytes=int(float(max_mb) * 1024**2) if max_mb else (2 * 1024**3 if hosted else None),
                   max_download_cache_bytes=int(float(cache_gb) * 1024**3) if cache_gb else (
                       20 * 1024**3 if hosted else None))


__all__ = ["Backend", "GenerationOutput", "LoadResult", "backend_from_env"]
