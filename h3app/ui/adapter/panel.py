"""Layout of one adapter slot (source → Inspect → strength → Load report → strength profile) and its events."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import gradio as gr

from ...hosting.gpu_gate import admitted, gpu_events
from ...rules.choices import QKV_LAYOUTS
from ...settings import BLOCKS
from ..change_events import CHEAP, ChangeEvents
from ..forms import KEEP, SCALE_RANGE, SLOT_FIELDS, SlotForm, chain_text, field_names, parts, read, source_text, write
from ..presenters import render
from ..unclamped import unclamped
from . import advanced_strength
from .events import AdapterEvents, InspectView, LoadView, ProfileBars, Readout, SourcePick, UploadView

INSPECTED: dict[str, Any] = {"api_visibility": "private", "concurrency_id": "inspect", "concurrency_limit": 4}
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
    uploaded: gr.State
    refused: gr.State  # the one-line refusal of the source as it stands (None: not refused)
    pending: gr.State  # a demo pick waiting for the person's word (it would replace the source they gave)
    confirm_box: gr.Row
    confirm_note: gr.HTML
    replace_button: gr.Button
    keep_button: gr.Button
    advanced: advanced_strength.AdvancedSection  # "Advanced strength": its controls are SlotForm fields too

    def __getattr__(self, name: str) -> gr.components.Component:
        """The "Advanced strength" controls, readable by their settings field names as every other control of the
        slot (``forms.parts``)."""
        advanced = self.__dict__.get("advanced")
        if advanced is not None and name in advanced.parts:
            return advanced.parts[name]
        raise AttributeError(f"{type(self).__name__} has no {name!r}")


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
            demo = gr.Dropdown(choices=demos, value=None, label="…or a demo adapter", scale=2, min_width=280,
                               elem_id=f"{prefix}-demo", info="small adapters for the tiny model, one per format; "
                                    "tiny_turbo_4step and tiny_style_warm are trained on it")
        with gr.Row(visible=False, equal_height=True, elem_id=f"{prefix}-demo-confirm") as confirm_box:
            confirm_note = gr.HTML("", scale=3)
            replace_button = gr.Button("Replace with the demo", size="sm", scale=1, elem_id=f"{prefix}-demo-replace")
            keep_button = gr.Button("Keep my source", size="sm", scale=1, elem_id=f"{prefix}-demo-keep")
        with gr.Row(equal_height=True):
            weight = gr.Dropdown(choices=[], value=None, label="Weight file", scale=3, allow_custom_value=True,
                                 min_width=320,
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
        preset_button = gr.Button("Apply preset (steps, shifts, scale, alpha, trigger)", size="sm",
                                  elem_id=f"{prefix}-preset")
    with gr.Accordion("Targets by group · raw inspect JSON", open=False):
        targets = gr.Dataframe(headers=render.TARGET_COLUMNS, interactive=False, wrap=True)
        info_json = gr.JSON(label="What Inspect read, as JSON", open=False)
        qkv_layout = gr.Dropdown(list(QKV_LAYOUTS), value="auto", label="QKV row layout",
                                 info="override only for trainers that kept an interleaved fused QKV without a tell")

    gr.Markdown("**Strength**", elem_classes=["h3-subhead"])
    with gr.Group(elem_classes=["h3-panel"]):
        with gr.Row(equal_height=True):
            override = gr.Checkbox(label="Override alpha", value=False, scale=1, elem_id=f"{prefix}-override",
                                   info="off = the file's alpha chain")
            alpha = gr.Textbox(label="alpha", value="", placeholder="e.g. 8", scale=1, max_lines=1,
                               elem_id=f"{prefix}-alpha", info="typing a value ticks Override")
        strength = unclamped(gr.Slider(*SCALE_RANGE, value=1.0, step=SCALE_STEP, label="Scale (strength)",
                             elem_id=f"{prefix}-scale", buttons=["reset"],
                             info="negative values push the other way (slider LoRAs)"))
        if mode is not None:
            mode.render()
    advanced = advanced_strength.build(slot)
    readout = gr.HTML(render.readout_html(None, None, 1.0), elem_id=f"{prefix}-readout")
    report_html = gr.HTML("", elem_id=f"{prefix}-report")
    with gr.Column(visible=False) as profile_box:
        gr.Markdown("**Strength profile** — where the adapter acts, and how hard (redrawn as alpha and scale "
                    "change)", elem_classes=["h3-subhead"])
        group_plot = gr.BarPlot(x="group", y="relative update", title="by group", height=170,
                                elem_id=f"{prefix}-group-plot",
                                y_title="median ‖ΔW‖/‖W‖", x_title="", show_label=False)
        block_plot = gr.BarPlot(x="block", y="relative update", title="by block", height=170,
                                y_title="median ‖ΔW‖/‖W‖", x_title="", sort=None, show_label=False)
        profile_html = gr.HTML(render.placeholder("Load the adapter to measure where it acts and how hard."),
                               elem_id=f"{prefix}-profile-note")
    return AdapterSlot(slot, source, demo, weight, revision, upload, qkv_layout, inspect_button, load_button,
                       inspect_html, alpha_html, known_html, known_box, preset_button, targets, info_json, override,
                       alpha, strength, readout, report_html, profile_box, group_plot, block_plot, profile_html,
                       gr.State(None), gr.State(None), gr.State(None), gr.State(None), gr.State(None), confirm_box,
                       confirm_note, replace_button, keep_button, advanced)


def slot_inputs(ui: AdapterSlot) -> dict[str, Any]:
    """The slot's controls by :class:`SlotForm` field name."""
    return parts(ui, SLOT_FIELDS)


def cleared_panel(ui: AdapterSlot, message: str) -> dict[Any, Any]:
    """The slot after a refusal or a source change: ``message`` in the inspect card, every result of the previous
    adapter gone (nothing else is marked: the one line is where the person is looking)."""
    return {ui.info: None, ui.refused: None, ui.inspect_html: message, ui.alpha_html: "",
            ui.readout: render.readout_html(None, None, 1.0),
            ui.known_html: "", ui.known_box: gr.update(visible=False), ui.basis: None, ui.report_html: "",
            ui.profile_box: gr.update(visible=False)}


def inspect_event(events: AdapterEvents, ui: AdapterSlot, token: Any, workflow: Any) -> Callable[..., Any]:
    """Inspect as one queued event: list the weight files, then read the header. A refusal (empty source, a bad
    path, a Hub repo out of reach) becomes one red line in the inspect card."""
    names = slot_inputs(ui)
    shown = parts(ui, field_names(InspectView))

    def inspect(values: dict[Any, Any]) -> dict[Any, Any]:
        slot = read(SlotForm, names, values)
        try:
            weights = events.list_weights(slot.source_to_read, slot.revision, values[token], slot.weight)
            view = events.inspect_view(replace(slot, weight=weights["value"]), values[token], values[workflow],
                                       values.get(ui.info))
        except gr.Error as error:  # the weight box and the line above Generate let go of the previous file too
            return {**cleared_panel(ui, render.refusal(error.message)), ui.refused: error.message,
                    ui.weight: gr.update(choices=[], value=None)}
        return {**write(view, shown), ui.weight: weights, ui.basis: None, ui.report_html: "", ui.refused: None,
                ui.profile_box: gr.update(visible=False)}

    return inspect


def inspect_outputs(ui: AdapterSlot) -> list[Any]:
    """What :func:`inspect_event` answers with."""
    return [*parts(ui, field_names(InspectView)).values(), ui.weight, ui.basis, ui.report_html, ui.profile_box,
            ui.refused]


def wire_adapter_slot(events: AdapterEvents, ui: AdapterSlot, changes: ChangeEvents, *, session: gr.State,
                      mode: gr.Radio, workflow: gr.Radio, token: gr.Textbox) -> None:
    """Bind the slot's events: inspect (listing + header), readout and profile (off the queue, through
    ``changes``), load (GPU)."""
    _wire_inspect(events, ui, token, workflow, changes)
    _wire_source_edits(ui, changes)
    _wire_alpha_box(ui, changes)
    _wire_strength(events, ui, changes)
    _wire_load(events, ui, session=session, mode=mode, workflow=workflow, token=token)


def _about_source(ui: AdapterSlot) -> Callable[[dict[Any, Any]], str]:
    """What Inspect and the "Source changed" clear answer for (``ChangeEvents.listen``'s ``about``): the box's text."""
    return lambda values: source_text(values[ui.source])


def _wire_inspect(events: AdapterEvents, ui: AdapterSlot, token: gr.Textbox, workflow: gr.Radio,
                  changes: ChangeEvents) -> None:
    """Inspect on the button, Enter or a weight pick, and after a demo pick or an upload has filled the slot; its
    card answers in the page's order (``changes.listen``: a "Source changed" sent after it covers it, and one sent
    before it, answered late, does not)."""
    inspect_inputs = {*slot_inputs(ui).values(), token, workflow, ui.info}
    inspect = inspect_event(events, ui, token, workflow)
    source_of = _about_source(ui)
    changes.listen(functools.partial(gr.on, [ui.inspect_button.click, ui.source.submit, ui.weight.input]), inspect,
                   inspect_inputs, inspect_outputs(ui), about=source_of, **INSPECTED)
    pick_parts = parts(ui, field_names(SourcePick))

    def pick(path: str | None, revision: str | None, token_value: str | None, current: str | None
             ) -> dict[Any, Any]:
        return write(events.pick_demo(path, revision, token_value, current), pick_parts)

    def confirm(path: str | None, revision: str | None, token_value: str | None) -> dict[Any, Any]:
        return write(events.confirm_demo(path, revision, token_value), pick_parts)

    def inspect_picked(values: dict[Any, Any]) -> dict[Any, Any]:
        """Inspect what a pick put in the box; nothing while the pick waits for the person's word."""
        return gr.skip() if values[ui.pending] else inspect(values)

    picked = ui.demo.input(pick, [ui.demo, ui.revision, token, ui.source], list(pick_parts.values()), **CHEAP)
    changes.listen(picked.success, inspect_picked, {*inspect_inputs, ui.pending}, inspect_outputs(ui),
                   about=source_of, **INSPECTED)
    confirmed = ui.replace_button.click(confirm, [ui.pending, ui.revision, token], list(pick_parts.values()),
                                        **CHEAP)
    changes.listen(confirmed.success, inspect, inspect_inputs, inspect_outputs(ui), about=source_of, **INSPECTED)
    ui.keep_button.click(lambda: write(events.keep_source(), pick_parts), None, list(pick_parts.values()), **CHEAP)
    upload_parts = parts(ui, field_names(UploadView))

    def upload(path: str | None, request: gr.Request | None = None) -> dict[Any, Any]:
        view = events.upload_view(path, request)
        return gr.skip() if view is None else write(view, upload_parts)

    uploaded = ui.upload.upload(upload, [ui.upload], list(upload_parts.values()), api_visibility="private")
    changes.listen(uploaded.success, inspect, inspect_inputs, inspect_outputs(ui), about=source_of, **INSPECTED)


def _wire_source_edits(ui: AdapterSlot, changes: ChangeEvents) -> None:
    """Typing a source lets go of the demo pick, so that leaving the box cannot bring the demo back; an alpha
    override belonged to the adapter shown before, so it goes too (and the alpha card says so). In the page's order
    (``changes.listen``): typing then Enter sends this clear first, and Inspect's card stays however late it lands."""

    def forget(source: str, override: bool, alpha: Any, info: dict[str, Any] | None) -> dict[Any, Any]:
        if info and (info.get("adapter") or [None])[0] == source_text(source):
            return gr.skip()  # the text still names the inspected file (Enter, or a key that changed nothing): keep it
        shown = {**cleared_panel(ui, render.placeholder("Source changed: press Inspect (or Enter).")), ui.demo: None,
                 ui.pending: None, ui.confirm_box: gr.update(visible=False)}
        if override and info:
            shown[ui.override] = False
            shown[ui.alpha_html] = render.card("info", f"Override alpha {render.esc(alpha)} was for "
                                                       f"{render.esc(info.get('name', 'the previous adapter'))}: "
                                                       f"dropped with it.", testid="override-dropped")
        return shown

    changes.listen(ui.source.input, forget, [ui.source, ui.override, ui.alpha, ui.info],
                   list(cleared_panel(ui, "")) + [ui.demo, ui.override, ui.pending, ui.confirm_box],
                   about=_about_source(ui), placeholder=True, **CHEAP)


def _wire_alpha_box(ui: AdapterSlot, changes: ChangeEvents) -> None:
    """The alpha box and Override agree however the box was filled: a value other than the file's own (typed,
    pasted, dropped — ``SlotForm.typed_alpha``) ticks Override, an emptied box unticks it, and unticking puts
    the file's alpha back in the box. The job and the line above Generate read the box by the same rule, so a
    click that comes before the tick still applies the alpha shown."""

    def follow_box(alpha: Any, info: dict[str, Any] | None) -> Any:
        tick = SlotForm(alpha=alpha, info=info).tick_for_box  # the box decides, never a possibly stale tick
        return gr.skip() if tick is None else tick

    def follow_tick(override: bool, info: dict[str, Any] | None) -> Any:
        return gr.skip() if override else chain_text(info)

    changes.on([ui.alpha.change], follow_box, [ui.alpha, ui.info], [ui.override])
    ui.override.input(follow_tick, [ui.override, ui.info], [ui.alpha], **CHEAP)


def _strength_parts(ui: AdapterSlot) -> dict[str, Any]:
    return {"override": ui.override, "alpha": ui.alpha, "strength": ui.strength, "info": ui.info,
            BLOCKS.name: ui.advanced.parts[BLOCKS.name]}  # per-block factors redraw the profile's block bars


def _readout_event(events: AdapterEvents, ui: AdapterSlot) -> Callable[[dict[Any, Any]], dict[Any, Any]]:
    """The alpha card and the effective-scale readout at the slot's alpha/scale."""
    strength_parts, readout_parts = _strength_parts(ui), parts(ui, field_names(Readout))

    def readout(values: dict[Any, Any]) -> dict[Any, Any]:
        return write(events.readout(values[ui.info], read(SlotForm, strength_parts, values)), readout_parts)

    return readout


def _axes_event(events: AdapterEvents, ui: AdapterSlot) -> Callable[[dict[Any, Any]], dict[Any, Any]]:
    """The bars' y axes, set after their data: Gradio's plot redraws with its previous data when the data and the
    axis change in one update, so the bars would lag one change behind their own axis."""
    strength_parts = _strength_parts(ui)

    def axes(values: dict[Any, Any]) -> dict[Any, Any]:
        bars = events.profile(values[ui.basis], read(SlotForm, strength_parts, values))
        return {plot: axis_only(getattr(bars, name)) for name, plot in (("group_plot", ui.group_plot),
                                                                        ("block_plot", ui.block_plot))}

    return axes


def _wire_strength(events: AdapterEvents, ui: AdapterSlot, changes: ChangeEvents) -> None:
    """Readout and profile bars redrawn off the queue as alpha and scale move; the axes follow."""
    strength_parts = _strength_parts(ui)
    readout, axes = _readout_event(events, ui), _axes_event(events, ui)
    profile_parts = parts(ui, field_names(ProfileBars))
    strength_inputs = {ui.info, ui.basis, *strength_parts.values()}

    def redraw(values: dict[Any, Any]) -> dict[Any, Any]:
        """Readout and profile bars at the current alpha/scale; the axes follow in ``axes``."""
        bars = events.profile(values[ui.basis], read(SlotForm, strength_parts, values))
        shown = dict(readout(values))
        for name, component in profile_parts.items():
            if getattr(bars, name) is not KEEP:
                shown[component] = bars_only(getattr(bars, name))
        return shown

    redraw_outputs = [*parts(ui, field_names(Readout)).values(), *profile_parts.values()]
    # always_last (ChangeEvents): the newest input last, so answers never arrive out of order
    changes.on([ui.override.change, ui.alpha.change, ui.strength.change, ui.advanced.parts[BLOCKS.name].change], redraw,
               strength_inputs, redraw_outputs, then=(axes, strength_inputs, [ui.group_plot, ui.block_plot]))


def _wire_load(events: AdapterEvents, ui: AdapterSlot, *, session: gr.State, mode: gr.Radio, workflow: gr.Radio,
               token: gr.Textbox) -> None:
    """Load (a GPU job): the match report and the profile, then the readout and the axes at the slot's settings."""
    names = slot_inputs(ui)
    load_parts = {**parts(ui, [n for n in field_names(LoadView) if n != "session"]), "session": session}

    def load(values: dict[Any, Any], request: gr.Request | None = None, progress: Any = gr.Progress()) -> dict[Any, Any]:
        try:
            view = events.load_view(values[session], ui.slot, read(SlotForm, names, values), values[mode],
                                    values[workflow], values[token], request=request, progress=progress)
        except gr.Error as error:
            return {ui.report_html: render.refusal(error.message)}
        shown = write(view, load_parts)
        return {c: bars_only(v) if isinstance(c, gr.BarPlot) else v for c, v in shown.items()}

    gpu = {**gpu_events(events.backend), "api_visibility": "private"}
    load_event = ui.load_button.click(admitted(load, events.backend), {session, *names.values(), mode, workflow, token},
                                      list(load_parts.values()), **gpu)
    strength_parts = _strength_parts(ui)
    load_event.success(_readout_event(events, ui), {ui.info, *strength_parts.values()},
                       list(parts(ui, field_names(Readout)).values()), **CHEAP)
    load_event.success(_axes_event(events, ui), {ui.info, ui.basis, *strength_parts.values()},
                       [ui.group_plot, ui.block_plot], **CHEAP)


def bars_only(update: Any) -> Any:
    """A bar-plot update without its axis limits (see :func:`_axes_event`)."""
    return {k: v for k, v in update.items() if k != "y_lim"} if isinstance(update, dict) else update


def axis_only(update: Any) -> Any:
    """A bar-plot update with only its axis limits (no change when there are none)."""
    if isinstance(update, dict) and "y_lim" in update:
        return gr.update(y_lim=update["y_lim"])
    return gr.skip()
