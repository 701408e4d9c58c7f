"""Equivalence check, alpha × scale grid and history compare: the comparison tabs' events.

The check runs A, A again (control), B and the old alpha = rank fallback through the full pipeline as one worker
job; the grid is one worker job that yields cells as they finish, each with its distance to the no-LoRA baseline;
the history keeps this session's results so that any two can be put side by side.
"""

from __future__ import annotations

import contextvars
import math
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr
import pandas as pd

from ...adapters.summary import AdapterSummary
from ...backend.generation import Cancelled
from ...backend.grid import GridCell, GridPlan, parse_values
from ...backend.grid_rows import GridRow, parse_row
from ...backend.media import decode_video, extract_audio
from ...backend.preview import PreviewBoard
from ...backend.worker import JobHandle, Progress
from ...errors import H3AppError
from ...hosting.visitors import session_key
from ...rules.alpha_source import AlphaSource
from ...rules.check_pair import CheckSetting, default_pair
from ...rules.choices import UNMERGED
from ...rules.values import parse_alpha, parse_seeds, parse_strength
from ..forms import KEEP, CheckForm, GridForm, JobForm, RequestForm, SlotForm
from ..generate.estimates import ASK, Ask, Estimate, check_line, estimator_for, grid_line
from ..generate.events import JobRunner, Stopped
from ..generate.preview_stream import check_stopped_where
from ..gradio_compat import client_gone
from ..presenters import history_words, render
from ..presenters.visitor_words import counted, visitor_text
from ..session import HistoryEntry, RunningJobs, Session, add_history, job_adapters, new_session
from ..user_error import user_error
from .layouts import check_value, grid_rows, grid_value, history_value, short_hash

if TYPE_CHECKING:
    from ...backend.service import Backend

PSNR_CAP_DB = 100.0  # identical frames have infinite PSNR; the plot shows them at this ceiling
PSNR_COLUMNS = ["frame", "PSNR (dB)", "pair"]
GRID_COLUMNS = ["α", "scale", "seed", "PSNR dB", "max |Δ|", "s", "hash", "equal to"]
HISTORY_COLUMNS = ["#", "result", "hash"]
DIFFERENCE_COLUMNS = ["setting", "A → B"]


def check_setting(alpha: str | float | None, strength: str | float | None, name: str) -> CheckSetting:
    """One side of the check; an empty alpha means auto (the alpha chain's value)."""
    try:
        return CheckSetting(parse_alpha(alpha), parse_strength(strength))
    except H3AppError as error:
        raise H3AppError(f"setting {name}: {error}") from None


def psnr_frame(series: Mapping[str, Any]) -> pd.DataFrame:
    """Rows (frame, PSNR capped at PSNR_CAP_DB, pair) for ``gr.LinePlot``; ``series`` maps pair → per-frame PSNR."""
    rows = []
    for pair, values in series.items():
        for index, value in enumerate(values):
            value = float(value)
            rows.append([index, PSNR_CAP_DB if not math.isfinite(value) else min(value, PSNR_CAP_DB), pair])
    return pd.DataFrame(rows, columns=PSNR_COLUMNS)


@dataclass(frozen=True)
class CheckView:
    """The Equivalence tab after a check."""

    verdict: str
    view: dict[str, Any]
    heat_ab: str
    heat_fallback: str
    psnr_plot: pd.DataFrame
    spectrogram_ab: str
    spectrogram_fallback: str
    result_json: dict[str, Any]
    session: Session


@dataclass(frozen=True)
class CheckPairView:
    """The check's A and B as the adapter suggests them, and the line that says why; ``suggested`` is the pair
    suggested (A and B stay KEEP when it was suggested already: what the person typed over it stays)."""

    a_alpha: Any
    a_scale: Any
    b_alpha: Any
    b_scale: Any
    pair_note: str
    suggested: Any = KEEP


@dataclass(frozen=True)
class GridView:
    """The Grid tab while cells arrive: the comparison view (cells under headers), table, status, the cells'
    JSON, and the session (KEEP until the grid is done: it is written once)."""

    view: dict[str, Any]
    table: pd.DataFrame
    status: str
    cells: list[dict[str, Any]]
    session: Any = KEEP


@dataclass(frozen=True)
class HistoryView:
    """The History tab: gallery and table of this session's results, and the A/B pickers (``gr.update``s)."""

    gallery: list[tuple[str, str]]
    table: pd.DataFrame
    pick_a: Any
    pick_b: Any


@dataclass(frozen=True)
class CompareView:
    """Two history entries in the comparison view, a verdict and the settings that differ (in words)."""

    view: dict[str, Any]
    verdict: str
    differences: pd.DataFrame


class ComparisonEvents:
    """Event functions of the Equivalence, Grid and History tabs, bound to one backend."""

    def __init__(self, backend: Backend, jobs: RunningJobs) -> None:
        self.backend = backend
        self.jobs = jobs
        self.runner = JobRunner(backend, jobs)

    # ------------------------------------------------------------------------------------------- equivalence
    def check(self, form: JobForm, check: CheckForm, http_request: gr.Request | None, progress: gr.Progress | None) -> Any:
        """EquivalenceResult for the session's first adapter (Stopped when cancelled)."""
        submit = self._check_job(form, check)
        return self.runner.run(submit, http_request, progress, "equivalence check")

    def _check_job(self, form: JobForm, check: CheckForm,
                   board: PreviewBoard | None = None) -> Callable[[], JobHandle]:
        """The check's submit (refused inputs raise ``gr.Error`` here, before anything is queued)."""
        try:
            generation = form.request.to_request()
            adapters = job_adapters(form.session, form.mode)
            if not adapters:
                raise H3AppError("the equivalence check needs an adapter: pick one in the adapter panel first.")
            a, b = check_setting(check.a_alpha, check.a_scale, "A"), check_setting(check.b_alpha, check.b_scale, "B")
        except H3AppError as error:
            raise user_error(error) from error
        return lambda: self.backend.submit_equivalence(generation, adapters[0], a, b, form.token or None,
                                                       previews=board)

    def check_view(self, form: JobForm, check: CheckForm, request: gr.Request | None = None,
                   progress: gr.Progress = gr.Progress()) -> CheckView | Stopped:
        """Run the check and lay out its verdict, videos, heat maps, PSNR plot, spectrograms and audio."""
        result = self.check(form, check, request, progress)
        if isinstance(result, Stopped):
            return result.after(form.session, "check")
        return self._check_finished(form, result)

    def check_views(self, form: JobForm, check: CheckForm, request: gr.Request | None, progress: gr.Progress | None,
                    board: PreviewBoard) -> Iterator[Progress | CheckView | Stopped]:
        """:meth:`check_view` with A, B and the fallback previewed on ``board`` after every step: the job's
        progress while it runs, then the view (or Stopped)."""
        result = yield from self.runner.stream(self._check_job(form, check, board), request, progress,
                                               "equivalence check", board)
        if isinstance(result, Stopped):  # each run's own steps, as its preview counted them (one count on the tab)
            where = check_stopped_where(board)
            yield (Stopped(f"**Cancelled** (equivalence check): {where}.") if where else result).after(form.session,
                                                                                                      "check")
        else:
            yield self._check_finished(form, result)

    def _check_finished(self, form: JobForm, result: Any) -> CheckView:
        data = result.to_json()
        runs = {"a": result.a, "b": result.b, "fallback": result.fallback}
        videos = {name: run.video_path for name, run in runs.items()}
        wavs = {name: str(extract_audio(path, Path(path).with_suffix(".wav"))) for name, path in videos.items()}
        plot = psnr_frame({"A vs B": result.a_vs_b.frame_psnr, "A vs fallback": result.a_vs_fallback.frame_psnr})
        session = form.session or new_session()
        for name, kind in (("b", "check B"), ("a", "check A"), ("fallback", "check fallback")):
            run = runs[name]
            session = add_history(session, kind=kind, label=f"{kind}: {render.setting_text(data[name])}",
                                  video=run.video_path, thumbnail=run.thumbnail_path, hash=run.hash,
                                  settings=column_settings(result.settings, data[name]))
        estimator_for(self.backend).learn(form.request.to_request(), result.seconds_per_run)  # A's run
        return CheckView(verdict=render.verdict_html(data), view=check_value(data, videos, wavs),
                         heat_ab=result.heatmap_path, heat_fallback=result.fallback_heatmap_path, psnr_plot=plot,
                         spectrogram_ab=result.spectrogram_diff_path,
                         spectrogram_fallback=result.fallback_spectrogram_diff_path, result_json=data,
                         session=session)

    @staticmethod
    def check_pair(info: Mapping[str, Any] | None, override: bool, alpha_text: Any,
                   suggested: Any = None) -> CheckPairView:
        """A = (alpha in use, 1) and B = (rank, alpha ÷ rank) for adapter 1 (``rules.check_pair.default_pair``);
        the person may type any other pair afterwards: when the pair is the one ``suggested`` last, A and B are
        left as they are (Gradio fires change events more than once per edit)."""
        alpha, source = alpha_in_use(info, override, alpha_text)
        rank = (info or {}).get("rank")
        a, b = default_pair(alpha, rank)
        if not info:
            note = (f"Pick an adapter: A and B then follow its alpha and rank (until then the LightX2V pair, "
                    f"alpha {a.alpha:g} × {a.strength:g} against {b.alpha:g} × {b.strength:g}).")
        elif alpha is None or not rank:
            note = ("This adapter has no single alpha or rank (they differ per module): type A and B, or keep "
                    f"the LightX2V pair alpha {a.alpha:g} × {a.strength:g} against {b.alpha:g} × {b.strength:g}.")
        else:
            assert a.alpha is not None  # default_pair gives A a number
            product = a.alpha * a.strength
            stronger = rank / alpha
            note = (f"**A** = alpha {a.alpha:g} × scale {a.strength:g} (the alpha in use, "
                    f"{AlphaSource.of(source).word}) and **B** = alpha {b.alpha:g} × scale "
                    f"{b.strength:g}: alpha × scale is {product:g} in both, so an exact engine makes them "
                    f"identical bit for bit. The **fallback** runs at alpha = rank = {rank}"
                    + (f", {stronger:g}× as strong as A." if abs(stronger - 1) > 1e-9 else ", the same as A."))
        pair = [a.alpha, a.strength, b.alpha, b.strength]
        if pair == suggested:
            return CheckPairView(KEEP, KEEP, KEEP, KEEP, note, KEEP)
        return CheckPairView(a.alpha, a.strength, b.alpha, b.strength, note, pair)

    @staticmethod
    def check_values_note(check: CheckForm) -> str:
        """The check's status line while A and B are typed: a refused value in one line, else nothing."""
        try:
            check_setting(check.a_alpha, check.a_scale, "A")
            check_setting(check.b_alpha, check.b_scale, "B")
        except H3AppError as error:
            return f"✖ Not applied: {visitor_text(str(error))}"
        return ""

    def check_estimate(self, request: RequestForm, estimate: Estimate | None | Ask = ASK) -> str:
        """What the check will cost, before it starts: its runs, and the seconds they add up to from the page's one
        estimator (``estimate``: one generation of this request, as Generate's line has it; asked when not given)."""
        return check_line(self.backend, request, estimate)

    # -------------------------------------------------------------------------------------------------- grid
    def plan(self, grid: GridForm) -> GridPlan:
        """The grid plan (cells and estimated time) for the axis texts; raises H3AppError on bad input."""
        seed_values = parse_seeds(grid.seeds, "seeds")
        adapters = len(self.rows(grid)) if grid.rows else 1
        return self.backend.plan_grid(parse_values(grid.alphas, "alphas", allow_auto=True),
                                      parse_values(grid.scales, "scales"), seed_values, adapters)

    def rows(self, grid: GridForm, mode: str = UNMERGED, token: str | None = None) -> list[GridRow]:
        """The adapters as rows (``backend.grid_rows``: a glob expands into one run's checkpoints, in order)."""
        return self.backend.grid_rows([parse_row(text, mode) for text in grid.rows or ()], token)

    def estimate(self, grid: GridForm, request: RequestForm | None = None, estimate: Estimate | None | Ask = ASK
                 ) -> str:
        """The up-front estimate shown before a grid runs (a problem with the axes is shown instead): its runs and
        their seconds from the page's one estimator (``estimate``: one generation of ``request``, asked when not
        given; no request: the model's default one)."""
        try:
            plan = self.plan(grid)
        except (H3AppError, ValueError) as error:
            return f"✖ {visitor_text(str(error))}"
        return grid_line(self.backend, plan, request, estimate)

    def grid_cells(self, form: JobForm, grid: GridForm, http_request: gr.Request | None,
                   progress: gr.Progress | None, stopped: list[Stopped] | None = None) -> Iterator[GridCell]:
        """Yield GridCells as they finish (one worker job; Cancel stops it between steps and appends the line to
        show to ``stopped``)."""
        stopped = [] if stopped is None else stopped
        try:
            generation = form.request.to_request()
            adapters = job_adapters(form.session, form.mode)
            if not adapters and not grid.rows:
                raise H3AppError("the grid needs an adapter: pick one in the adapter panel first, or adapters as "
                                 "rows in this tab.")
            # adapters as rows (this tab's), else adapter 1 over the alphas
            target = self.rows(grid, form.mode or UNMERGED, form.token or None) if grid.rows else adapters[0]
            plan = self.plan(grid)
        except (H3AppError, ValueError) as error:
            raise user_error(H3AppError(str(error))) from error
        key = session_key(http_request)
        if self.jobs.start(key):
            stopped.append(self.runner.stopped("grid", "cancelled before it started."))
            return
        finished = [0]
        # the backend reports steps from its own thread, where Gradio's progress context is missing: run each report
        # in a copy of this event's context
        context = contextvars.copy_context()

        def on_step(done: int, total: int) -> None:
            # ``done``/``total`` count the whole grid's denoising steps (no-LoRA baselines included)
            if progress is None:
                return
            context.copy().run(progress, done / total if total else None,
                               desc=grid_progress(finished[0], plan.cells, done, total))

        try:
            for cell in self.backend.grid(generation, target, plan, form.token or None, on_step,
                                          on_handle=lambda handle: self.jobs.set(key, handle),
                                          abandoned=client_gone()):
                finished[0] += 1
                yield cell
        except Cancelled as error:
            stopped.append(self.runner.stopped("grid", f"{error}".rstrip(".") + f" ({finished[0]} of {plan.cells} "
                                                                                  f"cells done)."))
        except H3AppError as error:
            raise user_error(error) from error
        finally:
            self.jobs.clear(key)

    def grid_view(self, form: JobForm, grid: GridForm, request: gr.Request | None = None,
                  progress: gr.Progress = gr.Progress()) -> Iterator[GridView]:
        """Generator: the view (cells under their headers), table and status after each finished cell; the
        session once, at the end."""
        try:
            plan = self.plan(grid)
        except (H3AppError, ValueError) as error:
            raise user_error(H3AppError(str(error))) from error
        run = uuid.uuid4().hex[:12]
        cells: list[GridCell] = []
        stopped: list[Stopped] = []

        def shown(status: str, session: Any = KEEP) -> GridView:
            return GridView(grid_value(cells, plan.alphas, plan.strengths, plan.seeds, run, plan.adapters),
                            pd.DataFrame(grid_rows(cells), columns=GRID_COLUMNS), status, cells_state(cells), session)

        for cell in self.grid_cells(form, grid, request, progress, stopped):
            cells.append(cell)
            yield shown(self._grid_status(cells))
        session = form.session or new_session()
        adapter = job_adapters(form.session, form.mode)[0].to_json() if cells and not grid.rows else {}
        request_json = form.request.to_request().to_json() if cells else {}
        for cell in cells:  # each cell's own provenance: the resolution its run applied
            settings = {"request": {**request_json, "seed": cell.seed},
                        "adapters": [cell.adapter or {**adapter, "alpha": cell.alpha, "strength": cell.strength}]}
            session = add_history(session, kind="grid", label=f"grid {cell.label + ' ' if grid.rows else ''}"
                                                                f"α{history_words.number(cell.alpha)}×"
                                                                f"{cell.strength:g} seed {cell.seed}",
                                  video=cell.video_path, thumbnail=cell.thumbnail_path, hash=cell.hash,
                                  settings=settings)
        yield shown(stopped[0].status if stopped else self._grid_status(cells, done=True), session)

    @staticmethod
    def _grid_status(cells: list[GridCell], done: bool = False) -> str:
        still = [c for c in cells if not math.isfinite(c.baseline_psnr)]
        text = f"{'Done' if done else 'Running'}: {counted(len(cells), 'cell')}."
        if still:
            text += (f" ⚠ **{counted(len(still), 'cell')} {'is' if len(still) == 1 else 'are'} identical to no "
                     f"LoRA** — the adapter did nothing there "
                     f"(scale 0, or keys not matched).")
        return text

    # ----------------------------------------------------------------------------------------------- history
    @staticmethod
    def history_view(session: Session | None) -> HistoryView:
        """This session's results, newest first, each labelled with its prompt, seed and adapter settings; A and
        B preset to the two newest."""
        history = list(reversed((session or new_session()).history))
        labels = {h.id: f"#{h.number} {history_words.entry_label(h.kind, h.settings)}" for h in history}
        gallery = [(h.thumbnail, labels[h.id]) for h in history if h.thumbnail]
        table = pd.DataFrame([[h.number, history_words.entry_label(h.kind, h.settings), short_hash(h.hash)]
                              for h in history], columns=HISTORY_COLUMNS)
        choices = [(labels[h.id], h.id) for h in history]
        ids = [h.id for h in history]
        first = ids[1] if len(ids) > 1 else (ids[0] if ids else None)
        return HistoryView(gallery, table, gr.update(choices=choices, value=first),
                           gr.update(choices=choices, value=ids[0] if ids else None))

    @staticmethod
    def compare(session: Session | None, a_id: str | None, b_id: str | None) -> CompareView:
        """Two history entries in the comparison view (decodes both mp4s when their hashes differ), and the
        settings they differ in, in words."""
        session = session or new_session()
        a, b = session.entry(a_id), session.entry(b_id)
        if a is None or b is None:
            raise gr.Error("pick two results of this session to compare (run something first).", print_exception=False)
        rows = [list(row) for row in history_words.differences(a.settings, b.settings)]
        table = pd.DataFrame(rows or [["(no differences in settings)", ""]], columns=DIFFERENCE_COLUMNS)
        return CompareView(history_value(a, b), _compare_verdict(a, b), table)


def _compare_verdict(a: HistoryEntry, b: HistoryEntry) -> str:
    if a.hash == b.hash:
        return render.card("ok", f"<div class='h3-big'>IDENTICAL ✔</div>same content hash "
                                 f"<code>{render.esc(a.hash[:23])}…</code> (bitwise, on the raw arrays).")
    detail = ""
    try:
        va, vb = decode_video(a.video), decode_video(b.video)
        if va.shape == vb.shape:
            from ...backend.metrics import psnr

            value = psnr(va, vb)
            detail = (f" PSNR {value:.1f} dB from the mp4s (lossy h264)." if math.isfinite(value)
                      else " The decoded mp4s are equal, but the raw outputs differ below h264's precision.")
        else:
            detail = f" Different shapes: {va.shape[1:3]} vs {vb.shape[1:3]}, {len(va)} vs {len(vb)} frames."
    except Exception as error:  # a file cleaned up after an hour, or unreadable: say so, keep the verdict
        detail = f" (could not decode the mp4s: {type(error).__name__})"
    return render.card("warn", f"<div class='h3-big'>DIFFERENT</div>hashes "
                               f"<code>{render.esc(a.hash[:19])}</code> vs "
                               f"<code>{render.esc(b.hash[:19])}</code>.{render.esc(detail)}")


def alpha_in_use(info: Mapping[str, Any] | None, override: bool, alpha_text: Any) -> tuple[float | None, str | None]:
    """(alpha, its source) that adapter 1 runs at: the override (ticked, or typed in the box:
    ``SlotForm.overrides``) when valid, else the file's chain (inspect's ``alpha``/``alpha_source``)."""
    if SlotForm(override=override, alpha=alpha_text, info=info).overrides:
        try:
            typed = parse_alpha(alpha_text)
        except H3AppError:
            typed = None
        if typed is not None:
            return typed, AlphaSource.EXPLICIT
    info = info or {}
    return info.get("alpha"), info.get("alpha_source")


def column_settings(settings: Mapping[str, Any], column: Mapping[str, Any]) -> dict[str, Any]:
    """A check column's settings in the history's shape: the request, and the adapter at the column's alpha and
    scale (the fallback: alpha = rank), its summary re-derived from the check's resolution through the one scale
    formula (``AdapterSummary.at``)."""
    adapter = dict(settings.get("adapter") or {})
    fallback = column.get("label") == "fallback"
    source: str | None  # an AlphaSource's value (the settings JSON's spelling)
    if fallback:
        alpha, source = adapter.get("rank"), AlphaSource.RANK_FALLBACK
    elif column.get("alpha") is not None:
        alpha, source = column["alpha"], AlphaSource.EXPLICIT
    else:
        alpha, source = adapter.get("stored_alpha"), adapter.get("alpha_source")
    strength = float(given) if (given := column.get("strength")) is not None else 1.0
    adapter.update(alpha=column.get("alpha"), strength=strength, resolved_alpha=alpha, resolved_alpha_source=source)
    if isinstance(adapter.get("resolved"), Mapping):
        at = AdapterSummary.from_json(adapter).at(None if fallback else column.get("alpha"), strength,
                                                  rank_fallback=fallback)
        adapter.update(resolved=at.to_json(), resolved_alpha=at.resolved_alpha,
                       effective_scale=at.effective_scale)
    return {**settings, "adapters": [adapter]}


def cells_state(cells: list[GridCell]) -> list[dict[str, Any]]:
    """Grid cells as JSON (for the API and for picking a cell's video)."""
    return [cell.to_json() for cell in cells]


def grid_progress(cells_done: int, cells: int, steps_done: int, steps: int) -> str:
    """The grid's progress line: cells finished and denoising steps of the whole grid (baselines included)."""
    return f"grid: {cells_done} of {cells} cells done · step {steps_done} of {steps} of the whole grid"
