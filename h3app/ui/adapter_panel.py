"""Layout of one adapter slot (source → Inspect → strength → Load report → strength profile) and its events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from . import render
from .adapter_events import AdapterEvents

CHEAP = {"queue": False, "show_progress": "hidden", "api_visibility": "private"}
GPU = {"concurrency_id": "gpu", "concurrency_limit": 1, "api_visibility": "private"}
SCALE_RANGE = (-2.0, 4.0)
SCALE_STEP = 0.0125  # 1/80: 0.0625 (= 1/16) and the usual 0.05 steps are on the grid


@dataclass
class AdapterSlot:
    """The components of one adapter slot."""

    slot: str
    source: gr.Textbox
    demo: gr.Dropdown
    weight: gr.Dropdown
    revision: gr.Textbox
    upload: gr.UploadButton
    qkv_layout: gr.Dropdown
    inspect_button: gr.Button
    load_button: gr.Button
    inspect_html: gr.HTML
    alpha_html: gr.HTML
    known_html: gr.HTML
    known_box: gr.Column
    preset_button: gr.Button
    targets: gr.Dataframe
    info_json: gr.JSON
    override: gr.Checkbox
    alpha: gr.Textbox
    strength: gr.Slider
    readout: gr.HTML
    report_html: gr.HTML
    profile_box: gr.Column
    group_plot: gr.BarPlot
    block_plot: gr.BarPlot
    profile_html: gr.HTML
    info: gr.State
    basis: gr.State

    def sync_inputs(self) -> list[Any]:
        """The controls a job reads, in the order ``AdapterEvents.sync_session`` takes them."""
        return [self.source, self.weight, self.revision, self.override, self.alpha, self.strength, self.qkv_layout]


def build_adapter_slot(events: AdapterEvents, slot: str, mode: gr.Radio | None = None) -> AdapterSlot:
    """Lay out one slot inside the current Blocks context; ``mode`` (the LoRA mode shared by every adapter of a job)
    is rendered inside this slot's strength box when given."""
    prefix = f"slot{slot}"
    demos = events.demo_choices()
    with gr.Group(elem_classes=["h3-panel"]):
        with gr.Row(equal_height=True):
            source = gr.Textbox(label="Adapter source", scale=3, elem_id=f"{prefix}-source",
                                placeholder="owner/repo · https://huggingface.co/…/resolve/… · "
                                            "/path/to/lora.safetensors")
            demo = gr.Dropdown(choices=demos, value=None, label="…or a demo adapter", scale=2,
                               elem_id=f"{prefix}-demo", info="small adapters for the tiny model, one per format")
        with gr.Row(equal_height=True):
            weight = gr.Dropdown(choices=[], value=None, label="Weight file", scale=3, allow_custom_value=True,
                                 elem_id=f"{prefix}-weight", info="listed from the repo or folder, with sizes")
            revision = gr.Textbox(label="Revision", placeholder="main", scale=1, elem_id=f"{prefix}-revision",
                                  info="branch, tag or commit")
        with gr.Row():
            inspect_button = gr.Button("Inspect (header only)", variant="primary", elem_id=f"{prefix}-inspect")
            load_button = gr.Button("Load & check match", variant="secondary", elem_id=f"{prefix}-load")
            upload = gr.UploadButton("Upload .safetensors", file_types=[".safetensors"], file_count="single",
                                     variant="secondary", elem_id=f"{prefix}-upload")
    inspect_html = gr.HTML(render.placeholder("Inspect reads the file's header — format, rank, targets, alpha — "
                                              "before anything is downloaded."), elem_id=f"{prefix}-inspect-card")
    alpha_html = gr.HTML("", elem_id=f"{prefix}-alpha-card")
    with gr.Column(visible=False) as known_box:  # shown for adapters in the registry of known adapters
        known_html = gr.HTML("", elem_id=f"{prefix}-known-card")
        preset_button = gr.Button("Apply preset (steps, shifts, scale, trigger)", size="sm",
                                  elem_id=f"{prefix}-preset")
    with gr.Accordion("Targets by group · raw inspect JSON", open=False):
        targets = gr.Dataframe(headers=render.TARGET_COLUMNS, interactive=False, wrap=True)
        info_json = gr.JSON(label="inspect --json", open=False)
        qkv_layout = gr.Dropdown(["auto", "blocked", "interleaved"], value="auto", label="QKV row layout",
                                 info="override only for trainers that kept an interleaved fused QKV without a tell")

    gr.Markdown("**Strength**", elem_classes=["h3-subhead"])
    with gr.Group(elem_classes=["h3-panel"]):
        with gr.Row(equal_height=True):
            override = gr.Checkbox(label="Override alpha", value=False, scale=1, elem_id=f"{prefix}-override",
                                   info="off = the file's alpha chain")
            alpha = gr.Textbox(label="alpha", value="", placeholder="e.g. 8", scale=1, max_lines=1,
                               elem_id=f"{prefix}-alpha", info="typing a value ticks Override")
        strength = gr.Slider(*SCALE_RANGE, value=1.0, step=SCALE_STEP, label="Scale (strength)",
                             elem_id=f"{prefix}-scale", buttons=["reset"],
                             info="negative values push the other way (slider LoRAs)")
        if mode is not None:
            mode.render()
    readout = gr.HTML(render.readout_html(None, None, 1.0), elem_id=f"{prefix}-readout")
    report_html = gr.HTML("", elem_id=f"{prefix}-report")
    with gr.Column(visible=False) as profile_box:
        gr.Markdown("**Strength profile** — where the adapter acts, and how hard (redrawn as alpha and scale "
                    "change)", elem_classes=["h3-subhead"])
        group_plot = gr.BarPlot(x="group", y="relative update", title="by group", height=170,
                                y_title="median ‖ΔW‖/‖W‖", x_title="", show_label=False)
        block_plot = gr.BarPlot(x="block", y="relative update", title="by block", height=170,
                                y_title="median ‖ΔW‖/‖W‖", x_title="", sort=None, show_label=False)
        profile_html = gr.HTML(render.placeholder("Load the adapter to measure where it acts and how hard."),
                               elem_id=f"{prefix}-profile-note")
    return AdapterSlot(slot, source, demo, weight, revision, upload, qkv_layout, inspect_button, load_button,
                       inspect_html, alpha_html, known_html, known_box, preset_button, targets, info_json, override,
                       alpha, strength, readout, report_html, profile_box, group_plot, block_plot, profile_html,
                       gr.State(None), gr.State(None))


def wire_adapter_slot(events: AdapterEvents, ui: AdapterSlot, *, session: gr.State, mode: gr.Radio,
                      workflow: gr.Radio, token: gr.Textbox) -> None:
    """Bind the slot's events: listing, inspect, readout (off the queue), load (on the GPU queue)."""
    inspect_inputs = [ui.source, ui.weight, ui.revision, token, workflow, ui.qkv_layout, ui.override, ui.alpha,
                      ui.strength]
    inspect_outputs = [ui.info, ui.inspect_html, ui.alpha_html, ui.readout, ui.known_html, ui.known_box,
                       ui.targets, ui.info_json, ui.alpha]
    cleared = [ui.basis, ui.report_html, ui.profile_box]

    def inspect_and_clear(*values: Any) -> tuple[Any, ...]:
        return (*events.inspect_view(*values), None, "", gr.update(visible=False))

    listed = ui.inspect_button.click(events.list_weights, [ui.source, ui.revision, token, ui.weight], [ui.weight],
                                     queue=False, api_visibility="private")
    listed.success(inspect_and_clear, inspect_inputs, inspect_outputs + cleared, api_visibility="private",
                   concurrency_id="inspect", concurrency_limit=4)
    submitted = ui.source.submit(events.list_weights, [ui.source, ui.revision, token, ui.weight], [ui.weight],
                                 queue=False, api_visibility="private")
    submitted.success(inspect_and_clear, inspect_inputs, inspect_outputs + cleared, api_visibility="private",
                      concurrency_id="inspect", concurrency_limit=4)
    picked = ui.demo.input(events.pick_demo, [ui.demo, ui.revision, token], [ui.source, ui.weight], **CHEAP)
    picked.success(inspect_and_clear, inspect_inputs, inspect_outputs + cleared, api_visibility="private",
                   concurrency_id="inspect", concurrency_limit=4)
    ui.weight.input(inspect_and_clear, inspect_inputs, inspect_outputs + cleared, api_visibility="private",
                    concurrency_id="inspect", concurrency_limit=4)
    uploaded = ui.upload.upload(events.upload, [ui.upload], [ui.source, ui.weight], api_visibility="private")
    uploaded.success(inspect_and_clear, inspect_inputs, inspect_outputs + cleared, api_visibility="private",
                     concurrency_id="inspect", concurrency_limit=4)

    def forget(_: str) -> tuple[Any, ...]:
        return (None, render.placeholder("Source changed: press Inspect (or Enter)."), "",
                render.readout_html(None, None, 1.0), "", gr.update(visible=False), None, "", gr.update(visible=False))

    ui.source.input(forget, [ui.source], [ui.info, ui.inspect_html, ui.alpha_html, ui.readout, ui.known_html,
                                          ui.known_box, ui.basis, ui.report_html, ui.profile_box], **CHEAP)
    ui.alpha.input(lambda: True, None, [ui.override], **CHEAP)

    strength_inputs = [ui.info, ui.override, ui.alpha, ui.strength]
    for trigger in (ui.override.change, ui.alpha.change, ui.strength.change):
        trigger(events.readout, strength_inputs, [ui.alpha_html, ui.readout], **CHEAP)
        trigger(events.profile, [ui.basis, ui.override, ui.alpha, ui.strength],
                [ui.group_plot, ui.block_plot, ui.profile_html], **CHEAP)

    def load(session_value: Any, source: str, weight: str, revision: str, override: bool, alpha: str,
             strength: float, mode_value: str, qkv: str, workflow_value: str, token_value: str,
             request: gr.Request = None, progress: Any = gr.Progress()) -> tuple[Any, ...]:
        return events.load_view(session_value, ui.slot, source, weight, revision, override, alpha, strength,
                                mode_value, qkv, workflow_value, token_value, request=request, progress=progress)

    load_event = ui.load_button.click(
        load, [session, ui.source, ui.weight, ui.revision, ui.override, ui.alpha, ui.strength, mode, ui.qkv_layout,
               workflow, token],
        [session, ui.info, ui.report_html, ui.basis, ui.group_plot, ui.block_plot, ui.profile_html, ui.profile_box],
        **GPU)
    load_event.success(events.readout, strength_inputs, [ui.alpha_html, ui.readout], **CHEAP)
