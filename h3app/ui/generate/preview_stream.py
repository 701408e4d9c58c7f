"""Step previews on the page: the Generate tab's preview beside "step 3 of 4", and the equivalence check's A, B and
fallback side by side at one step. The job events are Gradio generators (``job_wiring``): while the job runs they
yield these updates from the request's own ``PreviewBoard`` (``h3app.backend.preview``), so a visitor only ever
sees the previews of their own job. A cancel keeps the last previews on screen with "stopped after k of n"."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr
import numpy as np

from ...backend.preview import PreviewBoard
from ...backend.worker import Progress

CHECK_COLUMNS = ("A", "B", "fallback")  # left to right; the backend runs the fallback first, then A, then B
CHECK_LABELS = {"A": "A", "B": "B", "fallback": "fallback (alpha = rank)"}
WAITING = "Step previews appear here: the first, middle and last frames of what each step is making."
PREVIEW_OFF = "Step preview off: nothing is decoded while the video is made (as fast as the API)."
# The share of a run's denoising time the page's previews may take (``PreviewBoard.budget``): the page's Generate
# stays within 10 % of /generate (bench/preview_page_cost.py measures it); the CLI's --preview keeps every step.
PAGE_PREVIEW_BUDGET = 0.05


@dataclass
class GeneratePreview:
    """The Generate tab's live preview and its line ("step 3 of 4")."""

    preview: gr.Image
    preview_note: gr.Markdown


def build_generate_preview() -> tuple[GeneratePreview, gr.Checkbox]:
    """The preview and its line, and the "Step preview" toggle (off: a run decodes no preview at all)."""
    with gr.Column(elem_id="generate-preview-box"):
        toggle = gr.Checkbox(label="Step preview", value=True, elem_id="step-preview",
                             info="what each step is making; thinned to stay within 5 % of the run's time")
        note = gr.Markdown(WAITING, elem_id="generate-preview-note", elem_classes=["h3-note"])
        image = gr.Image(label="Step preview — first, middle and last frame of what this step predicts",
                         interactive=False, height=180, elem_id="generate-preview", format="png",
                         buttons=[])
    return GeneratePreview(image, note), toggle


def preview_toggled(on: bool) -> str:
    """The preview's line when the toggle changes."""
    return WAITING if on else PREVIEW_OFF


@dataclass
class CheckPreviews:
    """The equivalence check's three live previews, one step for all, and their line."""

    preview_a: gr.Image
    preview_b: gr.Image
    preview_fallback: gr.Image
    preview_note: gr.Markdown


def build_check_previews() -> CheckPreviews:
    note = gr.Markdown("A, B and the fallback appear here step by step while the check denoises, each at the same "
                       "step.", elem_id="check-preview-note", elem_classes=["h3-note"])
    with gr.Row(elem_id="check-previews"):
        images = {column: gr.Image(label=CHECK_LABELS[column], interactive=False, height=150, format="png",
                                   elem_id=f"check-preview-{column.lower()}", buttons=[], min_width=160)
                  for column in CHECK_COLUMNS}
    return CheckPreviews(images["A"], images["B"], images["fallback"], note)


class SentImages:
    """One job's stream sends each preview image to its component once; an unchanged one is ``gr.skip()``.

    Gradio stores a numpy image by truncating and rewriting the cache file named by the image's content hash; a
    running job's updates carried every column's unchanged preview again on each tick, so that file was rewritten
    while the page was still reading it (the server logged "Too much data for declared Content-Length" and the page
    showed a broken image, seen after a cancelled check on a loaded server)."""

    def __init__(self) -> None:
        self._last: dict[Any, np.ndarray] = {}

    def only_new(self, update: dict[Any, Any]) -> dict[Any, Any]:
        """``update`` with each image already sent to its component (the same array) replaced by ``gr.skip()``."""
        out: dict[Any, Any] = {}
        for component, value in update.items():
            if isinstance(value, np.ndarray):
                if self._last.get(component) is value:
                    value = gr.skip()
                else:
                    self._last[component] = value
            else:
                self._last.pop(component, None)  # cleared or replaced: the next image is new to the page
            out[component] = value
        return out


def waiting_line(progress: Progress) -> str:
    """What the job is doing before its first preview: queued (with its place), applying adapters, …"""
    if progress.phase == "queued":
        return f"Queued (position {progress.position}): previews start with the first step."
    return f"{progress.phase[:1].upper()}{progress.phase[1:]}…"


def generate_update(parts: GeneratePreview, board: PreviewBoard, progress: Progress) -> dict[Any, Any]:
    """The preview and "step k of n" while a generation runs (the image only when a new step arrived)."""
    latest = board.latest()
    if latest is None:  # the previous run's preview goes: this one has not made a step yet
        return {parts.preview_note: waiting_line(progress), parts.preview: None}
    line = f"**Step {latest.step} of {latest.count}** ({latest.decoder} preview)"
    if latest.step == latest.count:
        line += " — decoding the video and audio"
    return {parts.preview_note: line, parts.preview: latest.image}


def generate_finished(parts: GeneratePreview, board: PreviewBoard, stopped: bool) -> dict[Any, Any]:
    """The line once the job ended: "stopped after k of n" (the last preview stays), or the last step's."""
    latest = board.latest()
    if latest is None:
        return {parts.preview_note: "Stopped before the first step." if stopped else WAITING}
    if stopped:
        return {parts.preview_note: f"**Stopped after {latest.step} of {latest.count} steps**: the last preview "
                                    f"stays shown.", parts.preview: latest.image}
    if latest.step < latest.count:  # thinned: a preview costs more than the budget's share of a step here
        return {parts.preview_note: f"Last preview at step {latest.step} of {latest.count}: on this model a preview "
                                    f"costs {latest.seconds / max(latest.step_seconds, 1e-9):.1f} steps, so they "
                                    f"were thinned to {PAGE_PREVIEW_BUDGET:.0%} of the run's time.",
                parts.preview: latest.image}
    return {parts.preview_note: f"Step {latest.count} of {latest.count}: the last preview is the video's first, "
                                f"middle and last frame.", parts.preview: latest.image}


def _columns(parts: CheckPreviews) -> dict[str, Any]:
    return {"A": parts.preview_a, "B": parts.preview_b, "fallback": parts.preview_fallback}


def check_line(board: PreviewBoard, columns: Sequence[str] = CHECK_COLUMNS) -> str:
    """Which step each column shows: "fallback · A at step 2 of 4 (B not started)"."""
    aligned = board.aligned(columns)
    if not aligned:
        return ""
    shown = [column for column in columns if column in aligned]
    step = {aligned[c].step for c in shown}
    count = next(iter(aligned.values())).count
    waiting = [c for c in columns if c not in aligned]
    text = f"{' · '.join(CHECK_LABELS[c] for c in shown)} at step {max(step)} of {count}"
    return text + (f" ({', '.join(CHECK_LABELS[c] for c in waiting)} not started)" if waiting else "")


def check_update(parts: CheckPreviews, board: PreviewBoard, progress: Progress) -> dict[Any, Any]:
    """The three previews at one step while the check runs."""
    aligned = board.aligned(CHECK_COLUMNS)
    images = {component: aligned[column].image if column in aligned else None  # not started: empty
              for column, component in _columns(parts).items()}
    if not aligned:
        return {**images, parts.preview_note: waiting_line(progress)}
    return {**images, parts.preview_note: f"**{check_line(board)}**"}


def check_finished(parts: CheckPreviews, board: PreviewBoard, stopped: bool) -> dict[Any, Any]:
    """The line once the check ended: the previews stay; "stopped after …" names where each column stopped."""
    aligned = board.aligned(CHECK_COLUMNS)
    images = {component: aligned[column].image for column, component in _columns(parts).items()
              if column in aligned}
    if not stopped:
        return {**images, parts.preview_note: "Each column's last step: its video's first, middle and last frame."}
    return {**images, parts.preview_note: "**Stopped**: the last previews stay shown (the status line says where)."}


def check_stopped_where(board: PreviewBoard) -> str:
    """Where each column of a stopped check stopped, in its own run's steps — the one count the tab gives:
    "fallback (alpha = rank) after 4 of 4, A after 1 of 4 steps; B not started" ("" before any preview)."""
    latest = {column: preview for column in CHECK_COLUMNS if (preview := board.latest(column)) is not None}
    if not latest:
        return ""
    where = ", ".join(f"{CHECK_LABELS[c]} after {p.step} of {p.count}" for c, p in latest.items()) + " steps"
    waiting = [CHECK_LABELS[c] for c in CHECK_COLUMNS if c not in latest]
    return where + (f"; {', '.join(waiting)} not started" if waiting else "")
