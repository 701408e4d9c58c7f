"""Layout of the Equivalence, Grid and History tabs."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from ..backend.equivalence import DEFAULT_A, DEFAULT_B
from . import render
from .comparison_events import GRID_COLUMNS, HISTORY_COLUMNS, PSNR_CAP_DB

EQUIVALENCE_INTRO = (
    "Does **alpha 8 × scale 1.0** give the same output as **alpha 128 × scale 0.0625**? Both products are 8, so with "
    "an exact engine they must be *bit-identical*. The third column is the old fallback — alpha = rank, scale 1 — "
    "which is what loaders that ignore alpha do. Uses **adapter 1** and the request above; A is also run twice as a "
    "determinism control.")
GRID_INTRO = ("Sweep alpha × scale (and seeds) with adapter 1 and the request above. Each cell shows how far it moved "
              "from the same request **without** the LoRA — a cell identical to no-LoRA means the adapter did "
              "nothing.")


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
    verdict: gr.HTML
    video_a: gr.Video
    video_b: gr.Video
    video_fallback: gr.Video
    caption_a: gr.Markdown
    caption_b: gr.Markdown
    caption_fallback: gr.Markdown
    heat_ab: gr.Image
    heat_fallback: gr.Image
    psnr_plot: gr.LinePlot
    spectrogram_ab: gr.Image
    spectrogram_fallback: gr.Image
    audio_a: gr.Audio
    audio_b: gr.Audio
    result_json: gr.JSON

    def outputs(self) -> list:
        return [self.verdict, self.video_a, self.video_b, self.video_fallback, self.caption_a, self.caption_b,
                self.caption_fallback, self.heat_ab, self.heat_fallback, self.psnr_plot, self.spectrogram_ab,
                self.spectrogram_fallback, self.audio_a, self.audio_b, self.result_json]


def build_equivalence_tab() -> EquivalenceTab:
    gr.Markdown(EQUIVALENCE_INTRO, elem_classes=["h3-note"])
    with gr.Row(equal_height=True):
        a_alpha = gr.Number(DEFAULT_A.alpha, label="A: alpha (empty = auto)", elem_id="a-alpha")
        a_scale = gr.Number(DEFAULT_A.strength, label="A: scale", elem_id="a-scale")
        b_alpha = gr.Number(DEFAULT_B.alpha, label="B: alpha (empty = auto)", elem_id="b-alpha")
        b_scale = gr.Number(DEFAULT_B.strength, label="B: scale", elem_id="b-scale")
    with gr.Row():
        run_button = gr.Button("Run the equivalence check", variant="primary", scale=3, elem_id="check")
        cancel_button = gr.Button("Cancel", variant="stop", scale=1, elem_id="check-cancel")
    estimate = gr.Markdown("", elem_id="check-estimate")
    cancel_note = gr.Markdown("", elem_id="check-cancel-note")
    status = gr.Markdown("", elem_id="check-status")
    verdict = gr.HTML(render.placeholder("The verdict appears here: identical bit for bit, or not."),
                      elem_id="verdict")
    with gr.Row():
        with gr.Column(min_width=160):
            video_a = gr.Video(label="A", interactive=False, height=180)
            caption_a = gr.Markdown("")
        with gr.Column(min_width=160):
            video_b = gr.Video(label="B", interactive=False, height=180)
            caption_b = gr.Markdown("")
        with gr.Column(min_width=160):
            video_fallback = gr.Video(label="fallback: alpha = rank, scale 1", interactive=False, height=180)
            caption_fallback = gr.Markdown("")
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
    with gr.Row():
        audio_a = gr.Audio(label="A audio", interactive=False, type="filepath")
        audio_b = gr.Audio(label="B audio", interactive=False, type="filepath")
    with gr.Accordion("check --json", open=False):
        result_json = gr.JSON(open=False)
    return EquivalenceTab(a_alpha, a_scale, b_alpha, b_scale, run_button, cancel_button, estimate, cancel_note,
                          status, verdict,
                          video_a,
                          video_b,
                          video_fallback, caption_a, caption_b, caption_fallback, heat_ab, heat_fallback, psnr_plot,
                          spectrogram_ab, spectrogram_fallback, audio_a, audio_b, result_json)


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
    gallery: gr.Gallery
    table: gr.Dataframe
    cell_video: gr.Video
    cells: gr.State


def build_grid_tab() -> GridTab:
    gr.Markdown(GRID_INTRO, elem_classes=["h3-note"])
    with gr.Row():
        alphas = gr.Textbox("1, 16", label="alphas (comma-separated; auto = the file's chain)", elem_id="grid-alphas")
        scales = gr.Textbox("0.5, 1.0", label="scales", elem_id="grid-scales")
        seeds = gr.Textbox("7", label="seeds", elem_id="grid-seeds")
    estimate = gr.Markdown("", elem_id="grid-estimate")
    with gr.Row():
        run_button = gr.Button("Run grid", variant="primary", scale=3, elem_id="grid-run")
        cancel_button = gr.Button("Cancel", variant="stop", scale=1, elem_id="grid-cancel")
    cancel_note = gr.Markdown("", elem_id="grid-cancel-note")
    status = gr.Markdown("", elem_id="grid-status")
    gallery = gr.Gallery(label="cells (middle frame) — click one to play it", columns=4, height="auto",
                         object_fit="contain", allow_preview=False, elem_id="grid-gallery")
    table = gr.Dataframe(headers=GRID_COLUMNS, interactive=False, wrap=False, elem_id="grid-table")
    cell_video = gr.Video(label="selected cell", interactive=False, height=220)
    return GridTab(alphas, scales, seeds, estimate, run_button, cancel_button, cancel_note, status, gallery, table,
                   cell_video,
                   gr.State([]))


@dataclass
class HistoryTab:
    gallery: gr.Gallery
    table: gr.Dataframe
    pick_a: gr.Dropdown
    pick_b: gr.Dropdown
    compare_button: gr.Button
    video_a: gr.Video
    video_b: gr.Video
    verdict: gr.HTML
    differences: gr.Dataframe


def build_history_tab() -> HistoryTab:
    gr.Markdown("This session's results, newest first. Pick any two to put them side by side.",
                elem_classes=["h3-note"])
    gallery = gr.Gallery(label="results", columns=6, height=200, object_fit="contain", allow_preview=False)
    table = gr.Dataframe(headers=HISTORY_COLUMNS, interactive=False, wrap=True, elem_id="history-table")
    with gr.Row(equal_height=True):
        pick_a = gr.Dropdown([], label="A", scale=2, elem_id="history-a")
        pick_b = gr.Dropdown([], label="B", scale=2, elem_id="history-b")
        compare_button = gr.Button("Compare", variant="primary", scale=1, elem_id="history-compare")
    with gr.Row():
        video_a = gr.Video(label="A", interactive=False, height=220)
        video_b = gr.Video(label="B", interactive=False, height=220)
    verdict = gr.HTML("")
    differences = gr.Dataframe(headers=["setting", "A", "B"], interactive=False, wrap=True,
                               elem_id="history-differences")
    return HistoryTab(gallery, table, pick_a, pick_b, compare_button, video_a, video_b, verdict, differences)
