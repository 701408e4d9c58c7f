"""The grid: rows of adapters (× alphas), columns of strengths, at each seed — one generation per cell, yielded as
each finishes, with its distance to the no-LoRA baseline (computed once per request and cached). A cell already
computed (same request, same adapter file, same settings) is served from the cell cache, not run again."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

from ..errors import H3AppError
from ..request import GenerationRequest
from ..rules import values
from ..settings import LoRASettings
from . import metrics
from .generation import GenerationResult, request_evaluations, run_generation, save_result
from .grid_rows import GridRow, plain_label
from .media import write_thumbnail
from .outputs import Outputs
from .preview import PreviewBoard
from .worker import Cancelled

if TYPE_CHECKING:
    from .adapter_binding import AdapterBinder

BASELINE_BYTES = 1024**3  # the no-LoRA outputs kept between grids: a decoded fp32 video is ~0.75 GB at 544p
CELL_BYTES = 2 * 1024**3  # the cells' outputs kept between grids (same rule): a grid re-run with one more column


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
    label: str = ""  # the row's adapter: file name, epoch/steps, trigger (``GridRow.label``)
    adapter_row: int = 0  # which adapter of the grid (rows = adapters × alphas)
    reused: bool = False  # served from the cell cache (computed before with the same request and settings)
    zerogpu: dict[str, Any] | None = None  # a grid split into ZeroGPU calls: its calls (``grid_calls.record``)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.zerogpu is None:
            del data["zerogpu"]
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
    adapters: int = 1  # adapter rows (each × alphas)

    @property
    def rows(self) -> int:
        return self.adapters * len(self.alphas)

    @property
    def cells(self) -> int:
        return self.rows * len(self.strengths) * len(self.seeds)


def plan_grid(alphas: Sequence[float | None], strengths: Sequence[float], seeds: Sequence[int],
              seconds_per_run: float | None, adapters: int = 1) -> GridPlan:
    """Validate the axes (alpha None = auto) and estimate the time: cells + 1 baseline run per seed. The cell cap
    is the model's (``Limits.check_grid``, applied by the backend)."""
    if not alphas or not strengths or not seeds or adapters < 1:
        raise H3AppError("the grid needs at least one adapter, one alpha, one scale and one seed.")
    plan = GridPlan(tuple(values.parse_alpha(a, "alpha") for a in alphas),
                    tuple(values.parse_strength(s, "scale") for s in strengths),
                    tuple(values.parse_int(s, "seed", values.MIN_SEED, values.MAX_SEED) for s in seeds), None,
                    adapters)
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


def cell_name(alpha: float | None, strength: float | None, seed: int, row: str = "") -> str:
    """A cell's name in files and preview folders: ``alpha8-scale1-seed0`` (alpha ``auto`` for the file's own),
    ``<row>-alpha8-scale1-seed0`` in a grid of several adapters (``row``: :func:`row_name`), or ``baseline-seed0``
    for the no-LoRA run (``strength`` None)."""
    if strength is None:
        return f"baseline-seed{seed}"
    prefix = f"{row}-" if row else ""
    return f"{prefix}alpha{'auto' if alpha is None else f'{alpha:g}'}-scale{strength:g}-seed{seed}"


def row_name(index: int, row: GridRow) -> str:
    """``r1-zorb-e2``: the adapter row's index and file stem, in characters every file system takes."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", plain_label(row.settings))[:60]
    return f"r{index}-{stem}"


def as_rows(adapter: LoRASettings | Sequence[GridRow]) -> list[GridRow]:
    """One adapter (the classic grid) or the grid's adapter rows (``grid_rows.expand_rows``)."""
    if isinstance(adapter, LoRASettings):
        return [GridRow(adapter, plain_label(adapter))]
    return list(adapter)


def cell_key(request_key: str, applied: dict[str, Any], pad_rank: int | None) -> str:
    """The cell cache's key: the seeded request, the applied adapter's whole provenance (file sha256, settings,
    resolved alphas) and the rank its factors were padded to under ``--compile``."""
    return request_key + json.dumps(applied, sort_keys=True, default=str) + f"|pad{pad_rank}"


def baseline_key(request: GenerationRequest, seed: int) -> str:
    """The baseline cache's key: the request at ``seed``, as JSON items."""
    return repr(sorted(dataclasses.replace(request, seed=seed).to_json().items()))


def run_baseline(binder: AdapterBinder, request: GenerationRequest, seed: int, *,
                 on_step: Callable[[int, int], None] | None = None, should_cancel: Callable[[], bool] | None = None,
                 previews: PreviewBoard | None = None) -> GenerationResult:
    """A grid's no-LoRA run of ``seed`` alone (a grid split into ZeroGPU calls runs it as its own call), as
    :func:`run_grid` runs it: no adapter's effect, the same pipeline and preview column; the model left at base."""
    seeded = dataclasses.replace(request, seed=seed)
    pipe = binder.model.pipeline(request.workflow)
    binder.baseline(request.workflow)
    listeners = (previews.listener(pipe, cell_name(None, None, seed)),) if previews is not None else ()
    try:
        return run_generation(pipe, seeded, on_step=on_step, should_cancel=should_cancel, listeners=listeners)
    finally:
        binder.baseline(request.workflow)


def run_grid(binder: AdapterBinder, request: GenerationRequest, adapter: LoRASettings | Sequence[GridRow], plan: GridPlan, *,
             outputs: Outputs, baselines: Baselines, cells: Baselines | None = None, token: str | None = None,
             on_step: Callable[[int, int], None] | None = None,
             should_cancel: Callable[[], bool] | None = None,
             previews: PreviewBoard | None = None) -> Iterator[GridCell]:
    """Yield the cells row by row (rows = adapters × alphas, columns = strengths, then seeds). ``baselines`` caches
    the no-LoRA output per request (keyed by the request's JSON, bounded), ``cells`` each cell's output (keyed by
    :func:`cell_key`): a cell computed before is not run again. The model is left with no adapter's effect
    afterwards (``AdapterBinder.baseline``: detached, or at strength 0 in place when compiled). Under
    ``--compile`` the rows' factors are zero-padded to the largest rank (``AdapterBinder.padded``): no recompile.
    ``on_step(done, total)`` counts the whole grid's denoising steps (baselines included), so a cancel says
    "cancelled after k of n steps" of the grid. Files go to ``outputs``, their settings as it records them.
    ``previews``: a preview after every evaluation, one column per cell and per baseline (:func:`cell_name`)."""
    rows = as_rows(adapter)
    run = _GridRun(binder, request, plan, rows, outputs, baselines, cells, token, on_step, should_cancel, previews)
    with binder.padded([row.settings for row in rows], request.workflow, token) as pad:
        try:
            for seed in plan.seeds:
                yield from run.seed_cells(seed, pad)
        finally:
            binder.baseline(request.workflow)


class _GridRun:
    """One grid's state: the step count across its runs, the files' stem, the caches."""

    def __init__(self, binder: AdapterBinder, request: GenerationRequest, plan: GridPlan, rows: list[GridRow],
                 outputs: Outputs, baselines: Baselines, cells: Baselines | None, token: str | None,
                 on_step: Callable[[int, int], None] | None, should_cancel: Callable[[], bool] | None,
                 previews: PreviewBoard | None) -> None:
        self.binder, self.request, self.plan, self.rows, self.outputs = binder, request, plan, rows, outputs
        self.baselines, self.cells, self.token, self.on_step = baselines, cells, token, on_step
        self.should_cancel, self.previews = should_cancel, previews
        self.pipe = binder.model.pipeline(request.workflow)
        outputs.folder.mkdir(parents=True, exist_ok=True)
        self.stem = uuid.uuid4().hex[:8]
        per_run = request_evaluations(self.pipe, request)
        self.keys = {seed: baseline_key(request, seed) for seed in plan.seeds}
        missing = sum(1 for key in self.keys.values() if baselines.get(key) is None)
        self.total = per_run * (len(rows) * len(plan.alphas) * len(plan.strengths) * len(plan.seeds) + missing)
        self.done = 0

    def generate(self, seeded: GenerationRequest, column: str) -> GenerationResult:
        def steps(done: int, _: int) -> None:
            if self.on_step is not None:
                self.on_step(self.done + done, self.total)

        listeners = (self.previews.listener(self.pipe, column),) if self.previews is not None else ()
        try:
            result = run_generation(self.pipe, seeded, on_step=steps, should_cancel=self.should_cancel,
                                    listeners=listeners)
        except Cancelled as stop:
            raise Cancelled(self.done + (stop.done or 0), self.total) from None
        self.done += result.evaluations
        return result

    def cell(self, seeded: GenerationRequest, settings: LoRASettings, name: str, pad: int | None
             ) -> tuple[GenerationResult, dict[str, Any], bool]:
        """One cell's result, its adapter's provenance, and whether it came from the cell cache. The adapter is
        applied either way (its provenance names the file's bytes, part of the key)."""
        applied = self.binder.apply([settings], seeded.workflow, self.token)[0].provenance()
        key = cell_key(self.keys[seeded.seed], applied, pad)
        cached = self.cells.get(key) if self.cells is not None else None
        if cached is not None:
            if self.should_cancel is not None and self.should_cancel():
                raise Cancelled(self.done, self.total)
            self.done += cached.evaluations
            if self.on_step is not None:
                self.on_step(self.done, self.total)
            return cached, applied, True
        result = self.generate(seeded, name)
        if self.cells is not None:
            self.cells.put(key, result)
        return result, applied, False

    def baseline(self, seeded: GenerationRequest) -> GenerationResult:
        base = self.baselines.get(self.keys[seeded.seed])
        if base is None:  # compiled: the grid's first adapter at strength 0 (no module class changes)
            first = dataclasses.replace(self.rows[0].settings, alpha=self.plan.alphas[0],
                                        strength=self.plan.strengths[0])
            self.binder.baseline(seeded.workflow, [first], self.token)
            base = self.generate(seeded, cell_name(None, None, seeded.seed))
            self.baselines.put(self.keys[seeded.seed], base)
        return base

    def seed_cells(self, seed: int, pad: int | None) -> Iterator[GridCell]:
        seeded = dataclasses.replace(self.request, seed=seed)
        folder, plan = self.outputs.folder, self.plan
        base = self.baseline(seeded)
        base_name = f"{self.stem}-baseline-{seed}"
        base_video = save_result(base, folder / f"{base_name}.mp4",
                                 self.outputs.record({"request": seeded.to_json(), "adapters": [], "hash": base.hash}))
        base_thumb = write_thumbnail(folder / f"{base_name}.png", base.video)
        for index, grid_row in enumerate(self.rows):
            prefix = row_name(index, grid_row) if len(self.rows) > 1 else ""
            for alpha_index, alpha in enumerate(plan.alphas):
                row = index * len(plan.alphas) + alpha_index
                for column, strength in enumerate(plan.strengths):
                    settings = dataclasses.replace(grid_row.settings, alpha=alpha, strength=strength)
                    result, applied, reused = self.cell(seeded, settings, cell_name(alpha, strength, seed, prefix),
                                                        pad)
                    name = f"{self.stem}-{row}-{column}-{seed}"
                    recorded = self.outputs.record({"request": seeded.to_json(), "alpha": alpha, "strength": strength,
                                                    "adapters": [applied], "hash": result.hash,
                                                    "cache": result.cache})
                    video = save_result(result, folder / f"{name}.mp4", recorded)
                    thumb = write_thumbnail(folder / f"{name}.png", result.video)
                    diff = metrics.compare(base.video, base.audio, result.video, result.audio)
                    yield GridCell(row, column, alpha, strength, seed, str(video), str(thumb), result.hash,
                                   diff.video_psnr, diff.video_max_abs_diff, result.seconds, str(base_video),
                                   str(base_thumb), base.hash, recorded["adapters"][0], result.cache,
                                   grid_row.label, index, reused)
