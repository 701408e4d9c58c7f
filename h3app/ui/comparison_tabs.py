"""Layout of the Equivalence, Grid and History tabs."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from ..backend.equivalence import DEFAULT_A, DEFAULT_B
from . import render
from .comparison_events import DIFFERENCE_COLUMNS, GRID_COLUMNS, HISTORY_COLUMNS, PSNR_CAP_DB
from .comparison_view import build_comparison_view

EQUIVALENCE_INTRO = (
    "Does **A** give the same output as **B**? Their alpha × scale products are equal, so with an exact engine they "
    "must be *bit-identical*. The third column is the old fallback — alpha = rank, scale 1 — which is what loaders "
    "that ignore alpha do. Uses **adapter 1** and the request above; A is also run twice as a determinism control.")
GRID_INTRO = ("Sweep alpha × scale (and seeds) with adapter 1 and the request above. Each cell shows how far it moved "
              "from the same request **without** the LoRA — a cell identical to no-LoRA means the adapter did "
              "nothing. Click a cell to play it beside the no-LoRA baseline; each further click plays it beside the "
              "cell clicked before.")


@dataclass
class EquivalenceTab:
    a_alpha: gr.Number
    a_scale: gr.Number
    b_alpha: gr.Number
    b_scale: gr.Number
    run_button: gr.Button
    cancel_button: gr.Button
    estimate: gr.Markdown
    cancel_note: gr.Markdown
    status: gr.Markdown
    pair_note: gr.Markdown
    verdict: gr.HTML
    view: gr.HTML
    heat_ab: gr.Image
    heat_fallback: gr.Image
    psnr_plot: gr.LinePlot
    spectrogram_ab: gr.Image
    spectrogram_fallback: gr.Image
    result_json: gr.JSON


def build_equivalence_tab() -> EquivalenceTab:
    gr.Markdown(EQUIVALENCE_INTRO, elem_classes=["h3-note"])
    pair_note = gr.Markdown("", elem_id="check-pair-note", elem_classes=["h3-note"])
    with gr.Row(equal_height=True):
        a_alpha = gr.Number(DEFAULT_A.alpha, label="A: alpha (empty = auto)", elem_id="a-alpha", min_width=120)
        a_scale = gr.Number(DEFAULT_A.strength, label="A: scale", elem_id="a-scale", min_width=120)
        b_alpha = gr.Number(DEFAULT_B.alpha, label="B: alpha (empty = auto)", elem_id="b-alpha", min_width=120)
        b_scale = gr.Number(DEFAULT_B.strength, label="B: scale", elem_id="b-scale", min_width=120)
    with gr.Row():
        run_button = gr.Button("Run the equivalence check", variant="primary", scale=3, elem_id="check")
        cancel_button = gr.Button("Cancel", variant="stop", scale=1, elem_id="check-cancel")
    estimate = gr.Markdown("", elem_id="check-estimate")
    cancel_note = gr.Markdown("", elem_id="check-cancel-note")
    status = gr.Markdown("", elem_id="check-status")
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
    with gr.Accordion("check --json", open=False):
        result_json = gr.JSON(open=False)
    return EquivalenceTab(a_alpha, a_scale, b_alpha, b_scale, run_button, cancel_button, estimate, cancel_note,
                          status, pair_note, verdict, view, heat_ab, heat_fallback, psnr_plot, spectrogram_ab,
                          spectrogram_fallback, result_json)


@dataclass
class GridTab:
    alphas: gr.Textbox
    scales: gr.Textbox
    seeds: gr.Textbox
    estimate: gr.Markdown
    run_button: gr.Button
    cancel_button: gr.Button
    cancel_note: gr.Markdown
    status: gr.Markdown
    view: gr.HTML
    table: gr.Dataframe
    cells: gr.State


def build_grid_tab() -> GridTab:
    gr.Markdown(GRID_INTRO, elem_classes=["h3-note"])
    with gr.Row():
        alphas = gr.Textbox("1, 16", label="alphas (comma-separated; auto = the file's chain)", elem_id="grid-alphas")
        scales = gr.Textbox("0.0625, 1", label="scales", elem_id="grid-scales")
        seeds = gr.Textbox("7", label="seeds", elem_id="grid-seeds")
    estimate = gr.Markdown("", elem_id="grid-estimate")
    with gr.Row():
        run_button = gr.Button("Run grid", variant="primary", scale=3, elem_id="grid-run")
        cancel_button = gr.Button("Cancel", variant="stop", scale=1, elem_id="grid-cancel")
    cancel_note = gr.Markdown("", elem_id="grid-cancel-note")
    status = gr.Markdown("", elem_id="grid-status")
    view = build_comparison_view("grid-view", "Run the grid: its cells appear here under their alpha and scale.")
    table = gr.Dataframe(headers=GRID_COLUMNS, interactive=False, wrap=True, elem_id="grid-table")
    return GridTab(alphas, scales, seeds, estimate, run_button, cancel_button, cancel_note, status, view, table,
                   gr.State([]))


@dataclass
class HistoryTab:
    gallery: gr.Gallery
    table: gr.Dataframe
    pick_a: gr.Dropdown
    pick_b: gr.Dropdown
    compare_button: gr.Button
    view: gr.HTML
    verdict: gr.HTML
    differences: gr.Dataframe


def build_history_tab() -> HistoryTab:
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
