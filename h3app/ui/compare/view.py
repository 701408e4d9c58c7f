"""The comparison view: one ``gr.HTML`` with its own JS (``view.js``) and CSS that plays any number of
results under one control — Play/Pause, scrub, loop, frame step, side by side or an A|B wipe or blink — with each
column's soundtrack and a switch of which one is heard. The Equivalence tab, the Grid (which adds its cells under
row and column headers, one click to compare) and History's compare all show it.

Its value is plain JSON built here; media are Gradio ``FileData`` dicts, so Gradio copies them to its cache (the
app's ``allowed_paths`` apply) and fills in their ``/gradio_api/file=`` URLs.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from ...backend.media import FPS

HERE = Path(__file__).parent
VIEW_JS = (HERE / "view.js").read_text(encoding="utf-8")
VIEW_CSS = (HERE / "view.css").read_text(encoding="utf-8")
MEDIA_TYPES = {".mp4": "video/mp4", ".wav": "audio/wav", ".png": "image/png", ".webp": "image/webp"}


@dataclass(frozen=True)
class ViewColumn:
    """One result in the view: ``key`` names it in the sound and wipe switches ("A", "B", "fallback", "α1×0.5");
    ``mark`` flags it ("= α1×1" for content equal to another column); ``audio`` defaults to the mp4's own track."""

    key: str
    label: str
    video: str
    caption: str = ""
    thumb: str | None = None
    audio: str | None = None
    mark: str = ""


@dataclass(frozen=True)
class GridLayout:
    """Cells under headers: ``rows`` are ``(header, [column index or None while it runs])``; ``baseline`` is the
    no-LoRA column's index, shown in a row of its own."""

    title: str
    corner: str
    headers: Sequence[str]
    rows: Sequence[tuple[str, Sequence[int | None]]]
    baseline: int | None = None


def file_data(path: str | None) -> dict[str, Any] | None:
    """A path as Gradio FileData (moved to the cache and given a URL when the value is sent)."""
    if not path:
        return None
    return gr.FileData(path=str(path), orig_name=Path(path).name,
                       mime_type=MEDIA_TYPES.get(Path(path).suffix.lower())).model_dump()


def view_value(columns: Sequence[ViewColumn], show: Sequence[int] | None = None, *, grids: Sequence[GridLayout] = (), title: str = "", empty: str = "", run: str | None = None
               ) -> dict[str, Any]:
    """The view's value: ``show`` are the columns played side by side (all of them by default); ``run`` ties the
    person's picks to one set of results (a new run forgets them)."""
    return {
        "run": run or uuid.uuid4().hex[:12],
        "fps": float(FPS),  # every mp4 of this app is written at this rate (frame step)
        "title": title,
        "empty": empty,
        "columns": [{"key": c.key, "label": c.label, "caption": c.caption, "mark": c.mark,
                     "video": file_data(c.video), "thumb": file_data(c.thumb), "audio": file_data(c.audio)}
                    for c in columns],
        "show": list(range(len(columns))) if show is None else [int(i) for i in show],
        "grids": [{"title": g.title, "corner": g.corner, "headers": list(g.headers), "baseline": g.baseline,
                   "rows": [{"header": header, "cells": list(cells)} for header, cells in g.rows]} for g in grids],
    }


def empty_value(text: str) -> dict[str, Any]:
    """The view before anything ran: the line to show in its place."""
    return view_value([], empty=text, run="empty")


def build_comparison_view(elem_id: str, placeholder: str) -> gr.HTML:
    """The view's component (CSS goes to ``launch(css=…)`` with the app's, see :data:`VIEW_CSS`)."""
    return gr.HTML(empty_value(placeholder), html_template="", js_on_load=VIEW_JS, apply_default_css=False,
                   elem_id=elem_id, elem_classes=["h3cv-host"], padding=False)


def equal_marks(keys: Sequence[str], hashes: Sequence[str], baseline_hash: str | None = None) -> list[str]:
    """``= <earlier key>`` for every column whose content hash equals an earlier column's (``= no LoRA`` for the
    baseline's), else ``""``."""
    first: dict[str, str] = {}
    if baseline_hash:
        first[baseline_hash] = "no LoRA"
    marks = []
    for key, digest in zip(keys, hashes):
        if digest in first:
            marks.append(f"= {first[digest]}")
        else:
            first[digest] = key
            marks.append("")
    return marks
