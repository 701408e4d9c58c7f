"""What the comparison view shows for each tab: the check's three columns, the grid's cells under their headers
(with the no-LoRA baseline as a cell of its own and equal content marked), and two history entries."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..presenters import render
from ..presenters.history_words import entry_label, number
from ..session import HistoryEntry
from .view import GridLayout, ViewColumn, equal_marks, view_value

if TYPE_CHECKING:
    from ...backend.grid import GridCell

HASH_CHARS = 12  # enough to tell results apart at a glance; the settings JSON has them whole
GRID_CORNER = "alpha ╲ scale"
ROWS_CORNER = "adapter ╲ scale"


def short_hash(digest: str) -> str:
    """``sha256:fef56…`` → the first HASH_CHARS hex digits."""
    return str(digest).removeprefix("sha256:")[:HASH_CHARS]


# ------------------------------------------------------------------------------------------------------- check
def check_value(data: Mapping[str, Any], videos: Mapping[str, str], wavs: Mapping[str, str]) -> dict[str, Any]:
    """A, B and the fallback of an equivalence result (``EquivalenceResult.to_json()``), each with its WAV; B and
    the fallback are marked when their content equals an earlier column's."""
    names = ("a", "b", "fallback")
    keys = ("A", "B", "fallback")
    marks = equal_marks(keys, [data[name]["hash"] for name in names])
    columns = []
    for name, key, mark in zip(names, keys, marks):
        column = data[name]
        columns.append(ViewColumn(
            key=key, label=f"{key}: {render.setting_text(column)}", video=videos[name], audio=wavs.get(name),
            caption=f"effective scale {render.scale_text(column['effective_scale'])} · hash "
                    f"{short_hash(column['hash'])}", mark=mark))
    return view_value(columns)


# -------------------------------------------------------------------------------------------------------- grid
def cell_key(cell: GridCell, several_seeds: bool, several_adapters: bool = False) -> str:
    """``α1×0.5`` (``α1×0.5 s7`` when the grid has several seeds; ``zorb-e2 (epoch 2) α auto×0.5`` when its rows are
    adapters): the cell's name in marks and switches."""
    key = f"α{'auto' if cell.alpha is None else number(cell.alpha)}×{number(cell.strength)}"
    key = f"{cell.label} {key}" if several_adapters else key
    return f"{key} s{cell.seed}" if several_seeds else key


def row_labels(cells: Sequence[GridCell], alphas: Sequence[float | None], adapters: int) -> list[str]:
    """The grid's row headers: ``α 1`` per alpha, or per adapter (× alpha) its label (file, epoch/steps, trigger)."""
    if adapters <= 1:
        return [f"α {number(alpha)}" for alpha in alphas]
    names = {c.adapter_row: c.label for c in cells}
    return [f"{names.get(a, f'adapter {a + 1}')}" + (f" · α {number(alpha)}" if len(alphas) > 1 else "")
            for a in range(adapters) for alpha in alphas]


def grid_value(cells: Sequence[GridCell], alphas: Sequence[float | None], strengths: Sequence[float],
               seeds: Sequence[int], run: str, adapters: int = 1) -> dict[str, Any]:
    """The grid so far: per seed a table (rows = alphas, or adapters × alphas; columns = scales) under its baseline;
    the view plays the baseline and the newest cell until the person clicks cells (each click compares with the
    one before)."""
    several = len(seeds) > 1
    labels = row_labels(cells, alphas, adapters)
    columns: list[ViewColumn] = []
    grids: list[GridLayout] = []
    newest, first_baseline = None, None
    for seed in seeds:
        mine = [c for c in cells if c.seed == seed]
        if not mine:
            continue
        baseline = len(columns)
        first_baseline = baseline if first_baseline is None else first_baseline
        columns.append(ViewColumn(key=f"no LoRA s{seed}" if several else "no LoRA", label=f"no LoRA · seed {seed}",
                                  video=mine[0].baseline_video_path, thumb=mine[0].baseline_thumbnail_path,
                                  caption="the same request without the adapter"))
        keys = [cell_key(c, several, adapters > 1) for c in mine]
        marks = equal_marks(keys, [c.hash for c in mine], mine[0].baseline_hash)
        at: dict[tuple[int, int], int] = {}
        for cell, key, mark in zip(mine, keys, marks):
            at[(cell.row, cell.column)] = newest = len(columns)
            shown = f"{cell.label} · " if adapters > 1 else ""
            columns.append(ViewColumn(key=key, label=f"{shown}α {number(cell.alpha)} × {number(cell.strength)}",
                                      video=cell.video_path, thumb=cell.thumbnail_path,
                                      caption=render.distance_text(cell.baseline_psnr), mark=mark))
        rows = [(label, [at.get((r, c)) for c in range(len(strengths))]) for r, label in enumerate(labels)]
        grids.append(GridLayout(title=f"seed {seed}", corner=GRID_CORNER if adapters <= 1 else ROWS_CORNER,
                                headers=[f"× {number(s)}" for s in strengths], rows=rows, baseline=baseline))
    show = [i for i in (first_baseline, newest) if i is not None]
    return view_value(columns, show, grids=grids, run=run,
                      empty="Run the grid: its cells appear here under their alpha and scale.")


def grid_rows(cells: Sequence[GridCell]) -> list[list[Any]]:
    """The per-cell table: alpha (after the row's adapter when the rows are adapters), scale, seed, PSNR to no-LoRA
    (dB), max |Δ|, seconds, hash, equal to."""
    rows = []
    adapters = len({getattr(c, "adapter_row", 0) for c in cells}) > 1
    for seed in sorted({c.seed for c in cells}):
        mine = [c for c in cells if c.seed == seed]
        marks = equal_marks([cell_key(c, False, adapters) for c in mine], [c.hash for c in mine],
                            mine[0].baseline_hash)
        for cell, mark in zip(mine, marks):
            psnr = "∞" if not math.isfinite(cell.baseline_psnr) else f"{cell.baseline_psnr:.1f}"
            alpha = f"{cell.label} · {number(cell.alpha)}" if adapters else number(cell.alpha)
            rows.append([alpha, number(cell.strength), cell.seed, psnr,
                         round(cell.baseline_max_abs_diff, 4), round(cell.seconds, 1), short_hash(cell.hash),
                         mark.removeprefix("= ")])
    return rows


# ----------------------------------------------------------------------------------------------------- history
def history_value(a: HistoryEntry, b: HistoryEntry) -> dict[str, Any]:
    """Two history entries side by side, labelled with their prompt, seed and adapter settings."""
    mark = "= A" if a.hash == b.hash else ""
    return view_value([ViewColumn(key="A", label=f"A: {entry_label(a.kind, a.settings)}", video=a.video,
                                  thumb=a.thumbnail, caption=f"hash {short_hash(a.hash)}"),
                       ViewColumn(key="B", label=f"B: {entry_label(b.kind, b.settings)}", video=b.video,
                                  thumb=b.thumbnail, caption=f"hash {short_hash(b.hash)}", mark=mark)])
