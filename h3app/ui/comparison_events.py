"""Equivalence check, alpha × scale grid and history compare: the comparison tabs' events.

The check runs A, A again (control), B and the old alpha = rank fallback through the full pipeline as one worker
job; the grid is one worker job that yields cells as they finish, each with its distance to the no-LoRA baseline;
the history keeps this session's results so that any two can be put side by side.
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import gradio as gr
import pandas as pd

from ..backend.generation import Cancelled
from ..backend.grid import parse_values
from ..backend.transformer_check import CheckSetting
from ..errors import H3AppError
from ..rules.values import parse_alpha, parse_strength
from . import render
from .adapter_events import user_error
from .client_gone import client_gone
from .forms import KEEP, CheckForm, GridForm, JobForm, RequestForm
from .generate_events import JobRunner, Stopped
from .media_tools import decode_video, extract_audio
from .session import RunningJobs, add_history, job_adapters, session_key

PSNR_CAP_DB = 100.0  # identical frames have infinite PSNR; the plot shows them at this ceiling
PSNR_COLUMNS = ["frame", "PSNR (dB)", "pair"]
GRID_COLUMNS = ["alpha", "scale", "seed", "vs no-LoRA", "max |Δ|", "seconds", "hash"]
HISTORY_COLUMNS = ["id", "kind", "hash", "video"]


def check_setting(alpha: Any, strength: Any, name: str) -> CheckSetting:
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
    video_a: str
    video_b: str
    video_fallback: str
    caption_a: str
    caption_b: str
    caption_fallback: str
    heat_ab: str
    heat_fallback: str
    psnr_plot: pd.DataFrame
    spectrogram_ab: str
    spectrogram_fallback: str
    audio_a: str
    audio_b: str
    result_json: dict[str, Any]
    session: dict[str, Any]


@dataclass(frozen=True)
class GridView:
    """The Grid tab while cells arrive: gallery, table, status, the cells' JSON, and the session (KEEP until the
    grid is done: it is written once)."""

    gallery: Any
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
    """Two history entries side by side: their videos, a verdict and the settings that differ."""

    video_a: str
    video_b: str
    verdict: str
    differences: pd.DataFrame


class ComparisonEvents:
    """Event functions of the Equivalence, Grid and History tabs, bound to one backend."""

    def __init__(self, backend: Any, jobs: RunningJobs) -> None:
        self.backend = backend
        self.jobs = jobs
        self.runner = JobRunner(backend, jobs)

    # ------------------------------------------------------------------------------------------- equivalence
    def check(self, form: JobForm, check: CheckForm, http_request: Any, progress: Any) -> Any:
        """EquivalenceResult for the session's first adapter (Stopped when cancelled)."""
        try:
            generation = form.request.to_request()
            adapters = job_adapters(form.session, form.mode)
            if not adapters:
                raise H3AppError("the equivalence check needs an adapter: pick one in the adapter panel first.")
            a, b = check_setting(check.a_alpha, check.a_scale, "A"), check_setting(check.b_alpha, check.b_scale, "B")
        except H3AppError as error:
            raise user_error(error) from error
        return self.runner.run(lambda: self.backend.submit_equivalence(generation, adapters[0], a, b,
                                                                       form.token or None),
                               http_request, progress, "equivalence check")

    def check_view(self, form: JobForm, check: CheckForm, request: gr.Request = None,
                   progress: Any = gr.Progress()) -> CheckView | Stopped:
        """Run the check and lay out its verdict, videos, heat maps, PSNR plot, spectrograms and audio."""
        result = self.check(form, check, request, progress)
        if isinstance(result, Stopped):
            return result
        data = result.to_json()
        audio_a = extract_audio(result.a.video_path, Path(result.a.video_path).with_suffix(".wav"))
        audio_b = extract_audio(result.b.video_path, Path(result.b.video_path).with_suffix(".wav"))
        plot = psnr_frame({"A vs B": result.a_vs_b.frame_psnr, "A vs fallback": result.a_vs_fallback.frame_psnr})
        session = form.session
        for kind, column in (("check B", data["b"]), ("check A", data["a"]),
                             ("check fallback", data["fallback"])):
            run = {"check A": result.a, "check B": result.b, "check fallback": result.fallback}[kind]
            session = add_history(session, {"kind": kind, "label": f"{kind}: {render.setting_text(column)}",
                                            "video": run.video_path, "thumbnail": run.thumbnail_path,
                                            "hash": run.hash, "settings": result.settings})
        return CheckView(verdict=render.verdict_html(data), video_a=result.a.video_path, video_b=result.b.video_path,
                         video_fallback=result.fallback.video_path, caption_a=render.column_caption(data["a"]),
                         caption_b=render.column_caption(data["b"]),
                         caption_fallback=render.column_caption(data["fallback"]), heat_ab=result.heatmap_path,
                         heat_fallback=result.fallback_heatmap_path, psnr_plot=plot,
                         spectrogram_ab=result.spectrogram_diff_path,
                         spectrogram_fallback=result.fallback_spectrogram_diff_path, audio_a=str(audio_a),
                         audio_b=str(audio_b), result_json=data, session=session)

    def check_estimate(self, request: RequestForm) -> str:
        """What the check will cost, before it starts: its runs and, once a generation has been timed on this
        server, the seconds they add up to."""
        try:
            cost = self.backend.check_cost(request.to_request())
        except H3AppError as error:
            return f"✖ {error}"
        return f"This check costs **{cost.describe()}** (A, B and the fallback in full; the control is one step)."

    # -------------------------------------------------------------------------------------------------- grid
    def plan(self, grid: GridForm) -> Any:
        """The grid plan (cells and estimated time) for the axis texts; raises H3AppError on bad input."""
        seed_values = [int(s) for s in parse_values(grid.seeds, "seeds")]
        return self.backend.plan_grid(parse_values(grid.alphas, "alphas", allow_auto=True),
                                      parse_values(grid.scales, "scales"), seed_values)

    def estimate(self, grid: GridForm) -> str:
        """The up-front estimate shown before a grid runs (a problem with the axes is shown instead)."""
        try:
            plan = self.plan(grid)
        except (H3AppError, ValueError) as error:
            return f"✖ {error}"
        runs = plan.cells + len(plan.seeds)
        if plan.estimated_seconds is None:
            timing = "time unknown until one generation has run on this server"
        else:
            timing = f"about **{_duration(plan.estimated_seconds)}** at the last run's speed"
        return (f"**{plan.cells} cells** ({len(plan.alphas)} alphas × {len(plan.strengths)} scales × "
                f"{len(plan.seeds)} seeds) + {len(plan.seeds)} no-LoRA baseline = {runs} generations — {timing}.")

    def grid_cells(self, form: JobForm, grid: GridForm, http_request: Any, progress: Any,
                   stopped: list[Stopped] | None = None) -> Iterator[Any]:
        """Yield GridCells as they finish (one worker job; Cancel stops it between steps and appends the line to
        show to ``stopped``)."""
        stopped = [] if stopped is None else stopped
        try:
            generation = form.request.to_request()
            adapters = job_adapters(form.session, form.mode)
            if not adapters:
                raise H3AppError("the grid needs an adapter: pick one in the adapter panel first.")
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
            for cell in self.backend.grid(generation, adapters[0], plan, form.token or None, on_step,
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

    def grid_view(self, form: JobForm, grid: GridForm, request: gr.Request = None,
                  progress: Any = gr.Progress()) -> Iterator[GridView]:
        """Generator: the gallery, table and status after each finished cell; the session once, at the end."""
        try:
            columns = len(self.plan(grid).strengths)  # rows = alphas, columns = scales
        except (H3AppError, ValueError) as error:
            raise user_error(H3AppError(str(error))) from error
        gallery: list[tuple[str, str]] = []
        rows: list[list[Any]] = []
        cells = []
        stopped: list[Stopped] = []
        for cell in self.grid_cells(form, grid, request, progress, stopped):
            alpha = "auto" if cell.alpha is None else f"{cell.alpha:g}"
            gallery.append((cell.thumbnail_path, f"α {alpha} × {cell.strength:g} · seed {cell.seed} · "
                                                 f"{render.distance_text(cell.baseline_psnr)}"))
            rows.append([alpha, cell.strength, cell.seed, render.distance_text(cell.baseline_psnr),
                         round(cell.baseline_max_abs_diff, 4), round(cell.seconds, 1), cell.hash[:12]])
            cells.append(cell)
            yield GridView(gr.update(value=list(gallery), columns=columns), pd.DataFrame(rows, columns=GRID_COLUMNS),
                           self._grid_status(cells), cells_state(cells))
        session = form.session
        for cell in cells:
            alpha = "auto" if cell.alpha is None else f"{cell.alpha:g}"
            label = f"grid α{alpha}×{cell.strength:g} seed {cell.seed}"
            session = add_history(session, {"kind": "grid", "label": label, "video": cell.video_path,
                                            "thumbnail": cell.thumbnail_path, "hash": cell.hash,
                                            "settings": {"alpha": cell.alpha, "strength": cell.strength,
                                                         "seed": cell.seed}})
        status = stopped[0].status if stopped else self._grid_status(cells, done=True)
        yield GridView(gr.update(value=list(gallery), columns=columns), pd.DataFrame(rows, columns=GRID_COLUMNS),
                       status, cells_state(cells), session)

    @staticmethod
    def _grid_status(cells: list[Any], done: bool = False) -> str:
        still = [c for c in cells if not math.isfinite(c.baseline_psnr)]
        text = f"{'Done' if done else 'Running'}: {len(cells)} cells."
        if still:
            text += (f" ⚠ **{len(still)} cells are identical to no LoRA** — the adapter did nothing there "
                     f"(scale 0, or keys not matched).")
        return text

    # ----------------------------------------------------------------------------------------------- history
    @staticmethod
    def history_view(session: dict[str, Any] | None) -> HistoryView:
        """This session's results, newest first; A and B preset to the two newest."""
        history = list(reversed((session or {}).get("history", [])))
        gallery = [(h["thumbnail"], h["id"]) for h in history if h.get("thumbnail")]
        table = pd.DataFrame([[h["id"], h["kind"], h["hash"][:19], Path(h["video"]).name] for h in history],
                             columns=HISTORY_COLUMNS)
        ids = [h["id"] for h in history]
        first = ids[1] if len(ids) > 1 else (ids[0] if ids else None)
        return HistoryView(gallery, table, gr.update(choices=ids, value=first),
                           gr.update(choices=ids, value=ids[0] if ids else None))

    @staticmethod
    def compare(session: dict[str, Any] | None, a_id: str | None, b_id: str | None) -> CompareView:
        """Two history entries side by side (decodes both mp4s when their hashes differ)."""
        entries = {h["id"]: h for h in (session or {}).get("history", [])}
        if a_id not in entries or b_id not in entries:
            raise gr.Error("pick two results of this session to compare (run something first).", print_exception=False)
        a, b = entries[a_id], entries[b_id]
        if a["hash"] == b["hash"]:
            verdict = render.card("ok", f"<div class='h3-big'>IDENTICAL ✔</div>same content hash "
                                        f"<code>{render.esc(a['hash'][:23])}…</code> (bitwise, on the raw arrays).")
        else:
            detail = ""
            try:
                va, vb = decode_video(a["video"]), decode_video(b["video"])
                if va.shape == vb.shape:
                    from ..backend.metrics import psnr

                    value = psnr(va, vb)
                    detail = (f" PSNR {value:.1f} dB from the mp4s (lossy h264)." if math.isfinite(value)
                              else " The decoded mp4s are equal, but the raw outputs differ below h264's precision.")
                else:
                    detail = f" Different shapes: {va.shape[1:3]} vs {vb.shape[1:3]}, {len(va)} vs {len(vb)} frames."
            except Exception as error:  # a file cleaned up after an hour, or unreadable: say so, keep the verdict
                detail = f" (could not decode the mp4s: {type(error).__name__})"
            verdict = render.card("warn", f"<div class='h3-big'>DIFFERENT</div>hashes "
                                          f"<code>{render.esc(a['hash'][:19])}</code> vs "
                                          f"<code>{render.esc(b['hash'][:19])}</code>.{render.esc(detail)}")
        rows = [[key, plain_value(key, va), plain_value(key, vb)]
                for key, va, vb in _differences(a.get("settings") or {}, b.get("settings") or {})]
        table = pd.DataFrame(rows or [["(no differences in settings)", "", ""]], columns=["setting", "A", "B"])
        return CompareView(a["video"], b["video"], verdict, table)


def cells_state(cells: list[Any]) -> list[dict[str, Any]]:
    """Grid cells as JSON (for the API and for picking a cell's video)."""
    return [cell.to_json() for cell in cells]


def _differences(a: Any, b: Any, prefix: str = "") -> Iterator[tuple[str, Any, Any]]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in sorted(set(a) | set(b)):
            if key in ("hash", "result"):
                continue
            yield from _differences(a.get(key), b.get(key), f"{prefix}{key}.")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b)):
            yield from _differences(x, y, f"{prefix}{index}.")
    elif a != b:
        yield prefix.rstrip("."), a, b


def plain_value(key: str, value: Any) -> str:
    """A setting as a person reads it (no Python reprs): an empty alpha is auto, adapters are named by file, lists
    and objects are spelled out."""
    if value is None:
        return "auto" if key.endswith("alpha") else "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        if "source" in value:
            alpha = value.get("alpha")
            return (f"{Path(str(value['source'])).name} (alpha {'auto' if alpha is None else f'{float(alpha):g}'} "
                    f"× scale {float(value.get('strength', 1.0)):g})")
        return ", ".join(f"{k} {plain_value(str(k), v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "; ".join(plain_value(key, v) for v in value) if value else "none"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "…"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"


def grid_progress(cells_done: int, cells: int, steps_done: int, steps: int) -> str:
    """The grid's progress line: cells finished and denoising steps of the whole grid (baselines included)."""
    return f"grid: {cells_done} of {cells} cells done · step {steps_done} of {steps} of the whole grid"
