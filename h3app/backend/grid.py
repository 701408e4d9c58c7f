"""The alpha × strength grid: one generation per cell, yielded as each finishes, with its distance to the
no-LoRA baseline (computed once per request and cached)."""

from __future__ import annotations

import dataclasses
import math
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

from ..errors import H3AppError
from ..rules import values
from ..settings import LoRASettings
from . import metrics
from .generation import GenerationRequest, GenerationResult, request_evaluations, run_generation, save_result
from .media import write_thumbnail
from .outputs import Outputs
from .preview import PreviewBoard
from .worker import Cancelled

BASELINE_BYTES = 1024**3  # the no-LoRA outputs kept between grids: a decoded fp32 video is ~0.75 GB at 544p


class Baselines:
    """The grid's no-LoRA outputs by request, least recently used first out once their decoded arrays exceed
    ``max_bytes`` (the newest is always kept: the running grid needs it)."""

    def __init__(self, max_bytes: int = BASELINE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, GenerationResult] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> GenerationResult | None:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
            return self._entries.get(key)

    def put(self, key: str, result: GenerationResult) -> None:
        with self._lock:
            self._entries[key] = result
            self._entries.move_to_end(key)
            while len(self._entries) > 1 and self.nbytes > self.max_bytes:
                self._entries.popitem(last=False)

    @property
    def nbytes(self) -> int:
        return sum(r.video.nbytes + r.audio.nbytes for r in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(frozen=True)
class GridCell:
    """One cell: its settings, media and how far it moved from the baseline (PSNR in dB, lower = further)."""

    row: int
    column: int
    alpha: float | None
    strength: float
    seed: int
    video_path: str
    thumbnail_path: str
    hash: str
    baseline_psnr: float
    baseline_max_abs_diff: float
    seconds: float
    baseline_video_path: str = ""  # the no-LoRA run of this cell's seed, so it can be shown as a cell of its own
    baseline_thumbnail_path: str = ""
    baseline_hash: str = ""
    adapter: dict[str, Any] | None = None  # the applied adapter's provenance (its ``resolved`` object included)
    cache: dict[str, Any] | None = None  # the step cache's record of this cell's run (``GenerationResult.cache``)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if not math.isfinite(self.baseline_psnr):
            data["baseline_psnr"] = "inf"
        return data


@dataclass(frozen=True)
class GridPlan:
    """The cells to run and the estimated total time (seconds) from the last measured generation."""

    alphas: tuple[float | None, ...]
    strengths: tuple[float, ...]
    seeds: tuple[int, ...]
    estimated_seconds: float | None

    @property
    def cells(self) -> int:
        return len(self.alphas) * len(self.strengths) * len(self.seeds)


def plan_grid(alphas: Sequence[float | None], strengths: Sequence[float], seeds: Sequence[int],
              seconds_per_run: float | None) -> GridPlan:
    """Validate the axes (alpha None = auto) and estimate the time: cells + 1 baseline run per seed. The cell cap
    is the model's (``Limits.check_grid``, applied by the backend)."""
    if not alphas or not strengths or not seeds:
        raise H3AppError("the grid needs at least one alpha, one scale and one seed.")
    plan = GridPlan(tuple(values.parse_alpha(a, "alpha") for a in alphas),
                    tuple(values.parse_strength(s, "scale") for s in strengths),
                    tuple(values.parse_int(s, "seed", values.MIN_SEED, values.MAX_SEED) for s in seeds), None)
    estimate = None if seconds_per_run is None else seconds_per_run * (plan.cells + len(plan.seeds))
    return dataclasses.replace(plan, estimated_seconds=estimate)


@overload
def parse_values(text: str, what: str, allow_auto: Literal[False] = False) -> list[float]: ...


@overload
def parse_values(text: str, what: str, allow_auto: bool) -> list[float | None]: ...


def parse_values(text: str, what: str, allow_auto: bool = False) -> list[float | None] | list[float]:
    """``"8, 16, auto"`` → ``[8.0, 16.0, None]`` (``auto`` only with ``allow_auto``; ranges are checked by
    :func:`plan_grid`)."""

    def item(word: str, name: str) -> float | None:
        if allow_auto and word.lower() in values.AUTO_WORDS:
            return None
        try:
            return values.parse_number(word, name)
        except H3AppError:
            raise H3AppError(f"{name} must be comma-separated numbers{' or auto' if allow_auto else ''}, "
                             f"got {values.short(word)}.") from None

    return values.parse_list(text, what, item)


def cell_name(alpha: float | None, strength: float | None, seed: int) -> str:
    """A cell's name in files and preview folders: ``alpha8-scale1-seed0`` (alpha ``auto`` for the file's own), or
    ``baseline-seed0`` for the no-LoRA run (``strength`` None)."""
    if strength is None:
        return f"baseline-seed{seed}"
    return f"alpha{'auto' if alpha is None else f'{alpha:g}'}-scale{strength:g}-seed{seed}"


def run_grid(binder: Any, request: GenerationRequest, adapter: LoRASettings, plan: GridPlan, *, outputs: Outputs,
             baselines: Baselines, token: str | None = None,
             on_step: Callable[[int, int], None] | None = None,
             should_cancel: Callable[[], bool] | None = None,
             previews: PreviewBoard | None = None) -> Iterator[GridCell]:
    """Yield the cells row by row (rows = alphas, columns = strengths, then seeds). ``baselines`` caches the
    no-LoRA output per request (keyed by the request's JSON, bounded); the model is left with no adapter's effect
    afterwards (``AdapterBinder.baseline``: detached, or at strength 0 in place when compiled).
    ``on_step(done, total)`` counts the whole grid's denoising steps (baselines included), so a cancel says
    "cancelled after k of n steps" of the grid. Files go to ``outputs``, their settings as it records them.
    ``previews``: a preview after every evaluation, one column per cell and per baseline (:func:`cell_name`)."""
    workflow = request.workflow
    output_dir = outputs.folder
    pipe = binder.model.pipeline(workflow)
    output_dir.mkdir(parents=True, exist_ok=True)
    stem = uuid.uuid4().hex[:8]
    per_run = request_evaluations(pipe, request)
    keys = {seed: repr(sorted(dataclasses.replace(request, seed=seed).to_json().items())) for seed in plan.seeds}
    missing = sum(1 for key in keys.values() if baselines.get(key) is None)
    total = per_run * (plan.cells + missing)
    offset = [0]

    def generate(seeded: GenerationRequest, column: str) -> GenerationResult:
        def steps(done: int, _: int) -> None:
            if on_step is not None:
                on_step(offset[0] + done, total)

        listeners = (previews.listener(pipe, column),) if previews is not None else ()
        try:
            result = run_generation(pipe, seeded, on_step=steps, should_cancel=should_cancel, listeners=listeners)
        except Cancelled as stop:
            raise Cancelled(offset[0] + (stop.done or 0), total) from None
        offset[0] += result.evaluations
        return result

    try:
        for seed in plan.seeds:
            seeded = dataclasses.replace(request, seed=seed)
            base = baselines.get(keys[seed])
            if base is None:  # compiled: the grid's adapter at strength 0 (no module class changes)
                first = dataclasses.replace(adapter, alpha=plan.alphas[0], strength=plan.strengths[0])
                binder.baseline(workflow, [first], token)
                base = generate(seeded, cell_name(None, None, seed))
                baselines.put(keys[seed], base)
            base_name = f"{stem}-baseline-{seed}"
            base_video = save_result(base, output_dir / f"{base_name}.mp4",
                                     outputs.record({"request": seeded.to_json(), "adapters": [], "hash": base.hash}))
            base_thumb = write_thumbnail(output_dir / f"{base_name}.png", base.video)
            for row, alpha in enumerate(plan.alphas):
                for column, strength in enumerate(plan.strengths):
                    settings = dataclasses.replace(adapter, alpha=alpha, strength=strength)
                    applied = binder.apply([settings], workflow, token)[0].provenance()
                    result = generate(seeded, cell_name(alpha, strength, seed))
                    name = f"{stem}-{row}-{column}-{seed}"
                    recorded = outputs.record({"request": seeded.to_json(), "alpha": alpha, "strength": strength,
                                               "adapters": [applied], "hash": result.hash, "cache": result.cache})
                    video = save_result(result, output_dir / f"{name}.mp4", recorded)
                    thumb = write_thumbnail(output_dir / f"{name}.png", result.video)
                    diff = metrics.compare(base.video, base.audio, result.video, result.audio)
                    yield GridCell(row, column, alpha, strength, seed, str(video), str(thumb), result.hash,
                                   diff.video_psnr, diff.video_max_abs_diff, result.seconds,
                                   str(base_video), str(base_thumb), base.hash, recorded["adapters"][0],
                                   result.cache)
    finally:
        binder.baseline(workflow)
