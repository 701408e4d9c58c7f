"""Layout of the Equivalence, Grid and History tabs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import gradio as gr

from ...rules.check_pair import DEFAULT_A, DEFAULT_B
from ...rules.request_defaults import TINY_DEFAULTS, GridAxes
from ...rules.values import ALPHA, STRENGTH
from ..generate.preview_stream import build_check_previews
from ..presenters import render
from ..unclamped import unclamped
from .diff_panel import DiffPanel, build_diff_panel
from .events import DIFFERENCE_COLUMNS, GRID_COLUMNS, HISTORY_COLUMNS, PSNR_CAP_DB
from .view import build_comparison_view

EQUIVALENCE_INTRO = (
    "Does **A** give the same output as **B**? Their alpha × scale products are equal, so with an exact engine they "
    "must be *bit-identical*. The third column is the old fallback — alpha = rank, scale 1 — which is what loaders "
    "that ignore alpha do. Uses **adapter 1** and the request above; A is also run twice as a determinism control.")
GRID_INTRO = ("Sweep alpha × scale (and seeds) with adapter 1 and the request above — or pick **adapters as rows** "
              "(several adapters, or one training run's checkpoints: a folder or repo with `,weight=*.safetensors`, "
              "ordered by epoch/steps) to compare them at each scale. Each cell shows how far it moved "
              "from the same request **without** the LoRA — a cell identical to no-LoRA means the adapter did "
              "nothing. Click a cell to play it beside the no-LoRA baseline; each further click plays it beside the "
              "cell clicked before.")
ROWS_INFO = ("empty: adapter 1 over the alphas. Each row runs at each scale (× the alphas: `auto` = each file's "
             "own); type a Hub repo id, URL or path, or SOURCE,weight=*.safetensors for one run's checkpoints")


@dataclass
class JobControls:
    """What every comparison job's tab has: Run and Cancel, the cost up front, Cancel's own line, the status line."""

    run_button: gr.Button
    cancel_button: gr.Button
    estimate: gr.Markdown
    cancel_note: gr.Markdown
    status: gr.Markdown


def build_job_controls(run_label: str, run_id: str, prefix: str, *, estimate_first: bool) -> JobControls:
    """Lay out a job's controls; the cost goes above the buttons (``estimate_first``) or under them."""
    if estimate_first:
        estimate = gr.Markdown("", elem_id=f"{prefix}-estimate")
    with gr.Row():
        run_button = gr.Button(run_label, variant="primary", scale=3, elem_id=run_id)
        cancel_button = gr.Button("Cancel", variant="stop", scale=1, elem_id=f"{prefix}-cancel")
    if not estimate_first:
        estimate = gr.Markdown("", elem_id=f"{prefix}-estimate")
    cancel_note = gr.Markdown("", elem_id=f"{prefix}-cancel-note")
    status = gr.Markdown("", elem_id=f"{prefix}-status")
    return JobControls(run_button, cancel_button, estimate, cancel_note, status)


@dataclass
class EquivalenceTab(JobControls):
    """The Equivalence tab: the A and B settings, the verdict, the comparison view and the differences."""

    a_alpha: gr.Number
    a_scale: gr.Number
    b_alpha: gr.Number
    b_scale: gr.Number
    pair_note: gr.Markdown
    verdict: gr.HTML
    view: gr.HTML
    heat_ab: gr.Image
    heat_fallback: gr.Image
    psnr_plot: gr.LinePlot
    spectrogram_ab: gr.Image
    spectrogram_fallback: gr.Image
    result_json: gr.JSON
    preview_a: gr.Image  # A, B and the fallback step by step while the check runs (generate/preview_stream.py)
    preview_b: gr.Image
    preview_fallback: gr.Image
    preview_note: gr.Markdown


def build_equivalence_tab() -> EquivalenceTab:
    """A and B (defaults: the LightX2V pair), Run/Cancel, the verdict, the view, heat-maps, PSNR, spectrograms."""
    gr.Markdown(EQUIVALENCE_INTRO, elem_classes=["h3-note"])
    pair_note = gr.Markdown("", elem_id="check-pair-note", elem_classes=["h3-note"])
    with gr.Row(equal_height=True):  # each box has the ends of the rule that checks it (rules.values)
        a_alpha = unclamped(gr.Number(DEFAULT_A.alpha, label="A: alpha (empty = auto)", elem_id="a-alpha",
                                      min_width=120), ALPHA.low, ALPHA.high)
        a_scale = unclamped(gr.Number(DEFAULT_A.strength, label="A: scale", elem_id="a-scale", min_width=120),
                            STRENGTH.low, STRENGTH.high)
        b_alpha = unclamped(gr.Number(DEFAULT_B.alpha, label="B: alpha (empty = auto)", elem_id="b-alpha",
                                      min_width=120), ALPHA.low, ALPHA.high)
        b_scale = unclamped(gr.Number(DEFAULT_B.strength, label="B: scale", elem_id="b-scale", min_width=120),
                            STRENGTH.low, STRENGTH.high)
    controls = build_job_controls("Run the equivalence check", "check", "check", estimate_first=False)
    live = build_check_previews()
    verdict = gr.HTML(render.placeholder("The verdict appears here: identical bit for bit, or not."),
                      elem_id="verdict")
    view = build_comparison_view("check-view", "A, B and the fallback play here, in step, once the check has run.")
    with gr.Row():
        heat_ab = gr.Image(label="|A − B| per pixel (black = 0)", interactive=False, height=180, type="filepath")
        heat_fallback = gr.Image(label="|A − fallback| per pixel", interactive=False, height=180, type="filepath")
    psnr_plot = gr.LinePlot(x="frame", y="PSNR (dB)", color="pair", height=220,
                            title=f"per-frame PSNR against A ({PSNR_CAP_DB:g} dB = identical)",
                            y_lim=[0, PSNR_CAP_DB + 5])
    with gr.Row():
        spectrogram_ab = gr.Image(label="audio: spectrogram |A − B| (dB)", interactive=False, height=160,
                                  type="filepath")
        spectrogram_fallback = gr.Image(label="audio: spectrogram |A − fallback| (dB)", interactive=False,
                                        height=160, type="filepath")
    with gr.Accordion("The check's result as JSON", open=False):
        result_json = gr.JSON(open=False)
    return EquivalenceTab(**vars(controls), a_alpha=a_alpha, a_scale=a_scale, b_alpha=b_alpha, b_scale=b_scale,
                          pair_note=pair_note, verdict=verdict, view=view, heat_ab=heat_ab,
                          heat_fallback=heat_fallback, psnr_plot=psnr_plot, spectrogram_ab=spectrogram_ab,
                          spectrogram_fallback=spectrogram_fallback, result_json=result_json, **vars(live))


@dataclass
class GridTab(JobControls):
    """The Grid tab: the axes as typed, the cells' view and table (``cells``: the cells so far, for clicks)."""

    alphas: gr.Textbox
    scales: gr.Textbox
    seeds: gr.Textbox
    view: gr.HTML
    table: gr.Dataframe
    cells: gr.State
    rows: gr.Dropdown
    diff: DiffPanel


def build_grid_tab(axes: GridAxes = TINY_DEFAULTS.grid, demos: Sequence[tuple[str, str]] = ()) -> GridTab:
    """The axes (the held model's default ``axes``), the adapters as rows (``demos``: (label, path) offered), the
    estimate above Run/Cancel, the cells' view and table."""
    gr.Markdown(GRID_INTRO, elem_classes=["h3-note"])
    rows = gr.Dropdown(list(demos), value=[], multiselect=True, allow_custom_value=True,
                       label="adapters as rows (optional)", info=ROWS_INFO, elem_id="grid-rows")
    with gr.Row():
        alphas = gr.Textbox(axes.alphas, label="alphas (comma-separated; auto = the file's chain)", elem_id="grid-alphas")
        scales = gr.Textbox(axes.scales, label="scales", elem_id="grid-scales")
        seeds = gr.Textbox(axes.seeds, label="seeds", elem_id="grid-seeds")
    controls = build_job_controls("Run grid", "grid-run", "grid", estimate_first=True)
    view = build_comparison_view("grid-view", "Run the grid: its cells appear here under their alpha and scale.")
    table = gr.Dataframe(headers=GRID_COLUMNS, interactive=False, wrap=True, elem_id="grid-table")
    diff = build_diff_panel(demos)
    return GridTab(**vars(controls), alphas=alphas, scales=scales, seeds=seeds, view=view, table=table,
                   cells=gr.State([]), rows=rows, diff=diff)


@dataclass
class HistoryTab:
    """The History tab: this session's results, two pickers, Compare and what it shows."""

    gallery: gr.Gallery
    table: gr.Dataframe
    pick_a: gr.Dropdown
    pick_b: gr.Dropdown
    compare_button: gr.Button
    view: gr.HTML
    verdict: gr.HTML
    differences: gr.Dataframe


def build_history_tab() -> HistoryTab:
    """The gallery and table of results, the A/B pickers and Compare, the verdict, differences and view."""
    gr.Markdown("This session's results, newest first. Pick any two to put them side by side.",
                elem_classes=["h3-note"])
    gallery = gr.Gallery(label="results", columns=6, height=200, object_fit="contain", allow_preview=False)
    table = gr.Dataframe(headers=HISTORY_COLUMNS, interactive=False, wrap=True, elem_id="history-table",
                         column_widths=["3em", "75%", "8.5em"])
    with gr.Row(equal_height=True):
        pick_a = gr.Dropdown([], label="A", scale=2, elem_id="history-a")
        pick_b = gr.Dropdown([], label="B", scale=2, elem_id="history-b")
        compare_button = gr.Button("Compare", variant="primary", scale=1, elem_id="history-compare")
    verdict = gr.HTML("", elem_id="history-verdict")
    differences = gr.Dataframe(headers=DIFFERENCE_COLUMNS, interactive=False, wrap=True,
                               elem_id="history-differences")
    view = build_comparison_view("history-view", "Pick two results and Compare: they play here, in step.")
    return HistoryTab(gallery, table, pick_a, pick_b, compare_button, view, verdict, differences)
