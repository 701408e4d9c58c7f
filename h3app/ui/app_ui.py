"""The whole Gradio app: adapter panel on the left, request + Generate / Equivalence / Grid / History on the right,
named API endpoints hidden below. Takes a backend object; holds no model logic.

Serving rules: every event that touches the model shares ``concurrency_id="gpu"`` — in local mode as many as the
backend's worker line (the worker runs them one at a time and tells each waiting page its place), and in hosted mode
the admission in front of it (``hosting/gpu_gate.py``); the queue is bounded (``hosting/limits.py``), a visitor's cheap
queued events too (``hosting/join_bound.py``), and cheap UI arithmetic runs off the queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gradio as gr

from ..backend.limits import Limits
from ..hosting.gpu_gate import queue_size
from ..hosting.join_bound import CheapJoinBound
from ..rules.choices import LORA_MODES, UNMERGED
from .adapter import advanced_strength
from .adapter.events import AdapterEvents
from .adapter.panel import AdapterSlot, build_adapter_slot, wire_adapter_slot
from .change_events import CHEAP, ChangeEvents
from .compare.diff_panel import wire_diff_panel
from .compare.events import ComparisonEvents
from .compare.tabs import EquivalenceTab, GridTab, build_equivalence_tab, build_grid_tab, build_history_tab
from .compare.view import VIEW_CSS
from .forms import GridForm, RequestForm, field_names, parts, read, write
from .generate.estimates import estimate_lines
from .generate.events import (
    GenerateEvents,
    WorkflowInputs,
    apply_preset,
    request_note,
    sample_prompt,
    trigger_button,
    with_trigger,
    workflow_inputs,
)
from .generate.preview_stream import PAGE_PREVIEW_BUDGET
from .generate.tab import NUMBER_FIELDS, RequestControls, bind_limits, build_generate_tab, build_request_controls
from .gradio_compat import hook_queue
from .hub.events import HubEvents
from .hub.panel import build_hub_panel, wire_hub_panel
from .job_wiring import Values, wire_jobs
from .presenters import render
from .serving.api import ApiEvents, build_api
from .serving.endpoint_guard import guard_events
from .session import RunningJobs, new_session
from .unclamped import NO_CLAMP_JS

if TYPE_CHECKING:
    from ..backend.service import Backend

TITLE = "H3 LoRA Lab"
# the predicted time: queued one at a time apart from the GPU (a new canvas or length is rehearsed, seconds)
ESTIMATE = {"api_visibility": "private", "concurrency_id": "estimate", "concurrency_limit": 1,
            "show_progress": "hidden", "trigger_mode": "always_last"}
CACHE_SECONDS = 3600
CSS = """
.h3-card {border-radius: 10px; padding: 10px 14px; margin: 6px 0; border: 1px solid; line-height: 1.45;}
.h3-card code {font-size: 0.85em;}
.h3-ok {background: #ecfdf5; border-color: #10b981; color: #064e3b;}
.h3-warn {background: #fffbeb; border-color: #f59e0b; color: #78350f;}
.h3-bad {background: #fef2f2; border-color: #ef4444; color: #7f1d1d;}
.h3-info {background: #eef2ff; border-color: #818cf8; color: #1e1b4b;}
.h3-plain {background: transparent; border-color: #d1d5db;}
.h3-big {font-size: 1.25em; font-weight: 700; margin-bottom: 2px;}
.h3-verdict {font-size: 1.6em;}
.h3-title {font-weight: 700; margin-bottom: 4px; word-break: break-all;}
.h3-label, .h3-small {font-size: 0.85em; opacity: 0.85;}
.h3-row {margin-top: 4px;}
.h3-chip {display: inline-block; padding: 1px 8px; margin: 2px 4px 2px 0; border-radius: 999px;
          background: rgba(99, 102, 241, 0.12); font-size: 0.85em;}
.h3-chip-strong {background: rgba(99, 102, 241, 0.28); font-weight: 600;}
.h3-table {width: 100%; font-size: 0.9em; margin-top: 4px; border-collapse: collapse;}
.h3-table th, .h3-table td {text-align: left; padding: 2px 6px; border-bottom: 1px solid rgba(0,0,0,0.08);}
.h3-placeholder {padding: 10px 14px; border: 1px dashed #c7cad1; border-radius: 10px; opacity: 0.75;
                 font-size: 0.92em; margin: 6px 0;}
.h3-step {font-weight: 700; font-size: 1.1em; margin: 4px 0 2px 0;}
.h3-header {display: flex; align-items: baseline; gap: 14px; flex-wrap: wrap;}
.h3-header h1 {margin: 0; font-size: 1.6em;}
.h3-note p {font-size: 0.92em; opacity: 0.9; margin: 2px 0;}
.h3-subhead p {font-weight: 700; margin: 8px 0 0 0;}
#grid-table th {white-space: nowrap;}
/* a card's table scrolls inside the card rather than past it; a value shows whole (14.375, not 14.37) */
.h3-card {overflow-x: auto;}
.h3-table th, .h3-table td {white-space: nowrap;}
#h3-main input[type=number] {min-width: 7ch;}
#hub-results table {min-width: 640px;}
#hub-results th {white-space: nowrap;}
.h3-schedule-plot {max-width: 100%;}
/* phones: the sections in their numbered order, 1 · Adapter, 2 · Request, 3 · Run, each the page's width */
@media (max-width: 720px) {
  #h3-main {flex-direction: column !important; align-items: stretch !important;}
  #h3-main > .column {min-width: 0 !important; width: 100% !important; max-width: 100%;}
}
"""


def header_html(backend: Backend, hardware: str | None = None) -> str:
    """The title row: model, hosted or local mode, and (from the entry point) the GPU, planned peak and headroom."""
    hosted = ("hosted mode: local paths limited to the demo adapters" if backend.hosted else "local mode")
    chips = [f"<span class='h3-chip h3-chip-strong'>model {render.esc(backend.model_name)}</span>",
             f"<span class='h3-chip'>{render.esc(hosted)}</span>"]
    if hardware:
        chips.append(f"<span class='h3-chip' data-testid='hardware'>{render.esc(hardware)}</span>")
    return (f"<div class='h3-header'><h1>{TITLE}</h1>"
            f"<span>Inspect, apply and compare LoRA adapters on <b>MiniMax H3</b> (video + stereo audio).</span>"
            + "".join(chips) + "</div>")


def build_app(backend: Backend, hardware: str | None = None, mcp: bool = False,
              preview_budget: float | None = PAGE_PREVIEW_BUDGET) -> gr.Blocks:
    """Lay out and wire the app for ``backend`` (an ``h3app.backend.service.Backend``); ``hardware``: the header's
    GPU line (``h3app.hardware.summary.hardware_line``), given by the entry point; ``mcp``: add the MCP tools
    (``serving/mcp_tools.py``; launch with ``launch_kwargs(backend, mcp=True)``); ``preview_budget``: the share of
    a run's denoising time its step previews may take (``PreviewBoard.budget``; None: a preview after every step)."""
    jobs = RunningJobs()
    adapter_events = AdapterEvents(backend, jobs)
    generate_events = GenerateEvents(backend, jobs)
    comparisons = ComparisonEvents(backend, jobs)
    with gr.Blocks(title=TITLE, delete_cache=(CACHE_SECONDS, CACHE_SECONDS)) as demo:
        session = gr.State(new_session())
        gr.HTML(header_html(backend, hardware))
        hub = build_hub_panel()  # full width: the results table has room for its columns
        with gr.Row(equal_height=False, elem_id="h3-main"):
            with gr.Column(scale=5, min_width=380):
                gr.HTML("<div class='h3-step'>1 · Adapter</div>")
                mode = gr.Radio(list(LORA_MODES), value=UNMERGED, label="LoRA mode (every adapter)",
                                elem_id="mode", render=False,
                                info="unmerged: exact, alpha/scale changes are free · merged: faster steps, "
                                     "re-merged from a pristine copy on change")
                slot_1 = build_adapter_slot(adapter_events, "1", mode)
                with gr.Accordion("Hugging Face token (private or gated repos)", open=False):
                    token = gr.Textbox(label="HF token", type="password", placeholder="hf_…", elem_id="token",
                                       info="sent with this request only; never stored or logged")
                with gr.Accordion("Second adapter (optional)", open=False):
                    slot_2 = build_adapter_slot(adapter_events, "2")
            with gr.Column(scale=7, min_width=420):
                gr.HTML("<div class='h3-step'>2 · Request</div>")
                request = bind_limits(build_request_controls(backend.limits, backend.defaults), backend.limits)
                gr.HTML("<div class='h3-step'>3 · Run and compare</div>")
                with gr.Tabs():
                    with gr.Tab("Generate", id="generate-tab"):
                        generate = build_generate_tab()
                    with gr.Tab("Equivalence", id="equivalence-tab"):
                        equivalence = build_equivalence_tab()
                    with gr.Tab("Grid", id="grid-tab"):
                        grid = build_grid_tab(backend.defaults.grid, adapter_events.demo_choices())
                    with gr.Tab("History", id="history-tab"):
                        history = build_history_tab()
        api_events = ApiEvents(adapter_events, generate_events, comparisons)
        build_api(api_events, session)
        hub_events = HubEvents(backend)
        wire_hub_panel(hub_events, hub, adapter_events, slot_1, token, request.workflow)
        wire_diff_panel(backend, grid.diff, token)  # the Grid tab's "How two adapters differ"
        if mcp:
            from .serving.mcp_tools import McpTools, build_mcp_tools

            build_mcp_tools(McpTools(api_events, hub_events), backend)

        changes = ChangeEvents()  # the redraws on change: one event per trigger, added by changes.wire()
        for slot in (slot_1, slot_2):
            wire_adapter_slot(adapter_events, slot, changes, session=session, mode=mode, workflow=request.workflow,
                              token=token)
            advanced_strength.wire(slot.advanced, request.steps, changes)  # its note and the schedule's plot
        _wire_request(request, slot_1, backend.limits, changes)
        _wire_estimates(demo, request, grid, equivalence, session, backend, comparisons)
        on_load = wire_jobs(session, mode, token, (slot_1, slot_2), request, generate, equivalence, grid, history,
                            adapter_events, generate_events, comparisons, changes, preview_budget)
        changes.wire()
        for fn, inputs, outputs in on_load:
            demo.load(fn, inputs, outputs, **CHEAP)
        demo.unload(generate_events.runner.abandon)
    guard_events(demo, backend)
    demo.queue(max_size=queue_size(backend), default_concurrency_limit=1)
    hook_queue(demo, CheapJoinBound() if backend.hosted else None)
    return demo


def _wire_request(request: RequestControls, slot_1: AdapterSlot, limits: Limits, changes: ChangeEvents) -> None:
    shown_inputs = parts(request, field_names(WorkflowInputs))

    def show_inputs(workflow: str) -> Values:
        return write(workflow_inputs(workflow), shown_inputs)

    changes.on([request.workflow.change], show_inputs, [request.workflow], list(shown_inputs.values()))
    numbers = parts(request, NUMBER_FIELDS)

    def note(values: Values) -> str:
        return request_note(read(RequestForm, numbers, values), limits, values[slot_1.info])

    changes.on([c.change for c in numbers.values()] + [slot_1.info.change], note, {*numbers.values(), slot_1.info},
               [request.steps_note])
    changes.on([slot_1.info.change], trigger_button, [slot_1.info], [request.trigger_button])
    request.trigger_button.click(with_trigger, [request.prompt, slot_1.info], [request.prompt], **CHEAP)
    for sample in request.samples:  # the button's value is its label: the prompt it puts in the box
        sample.click(sample_prompt, [sample], [request.prompt], **CHEAP)
    preset_parts = {"strength": slot_1.strength, "override": slot_1.override, "alpha": slot_1.alpha,
                    **parts(request, ["steps", "shift", "audio_shift", "workflow", "prompt"])}

    def preset(info: dict[str, Any] | None, prompt: str | None) -> Values:
        return write(apply_preset(info, prompt), preset_parts)

    slot_1.preset_button.click(preset, [slot_1.info, request.prompt], list(preset_parts.values()), **CHEAP)


def _wire_estimates(demo: gr.Blocks, request: RequestControls, grid: GridTab, equivalence: EquivalenceTab,
                    session: gr.State, backend: Backend, comparisons: ComparisonEvents) -> None:
    """Every time the page states before a click — Generate's line, the check's cost, the Grid's — from the one
    estimator (``generate/estimates.py``), in one event: on load, whenever a number that changes them changes, and
    after every job (the session's change: the estimator has learned the run). Queued apart from the GPU (a new
    canvas or length is rehearsed once, seconds)."""
    numbers = parts(request, NUMBER_FIELDS + ("workflow", "cache"))
    axes = parts(grid, field_names(GridForm))
    outputs = {"generate": request.time_note, "check": equivalence.estimate, "grid": grid.estimate}

    def lines(values: Values) -> Values:
        shown = estimate_lines(backend, comparisons, read(RequestForm, numbers, values), read(GridForm, axes, values))
        return {outputs[name]: text for name, text in shown.items()}

    triggers = [numbers[name].change for name in ("steps", "duration", "height", "width", "workflow", "cache")]
    gr.on([demo.load, session.change, *triggers, *(box.change for box in axes.values())], lines,
          {*numbers.values(), *axes.values()}, list(outputs.values()), **ESTIMATE)


def launch_kwargs(backend: Backend, mcp: bool = False) -> dict[str, Any]:
    """What ``launch`` needs: outputs served from the backend's folder (never its uploads), theme and CSS, uploads
    capped in hosted mode, Gradio's browser-side run history off (it would keep the HF token field's value in localStorage);
    ``mcp``: Gradio's MCP server on (``app.py --mcp`` or ``GRADIO_MCP_SERVER=true``), with ``build_app(mcp=True)``."""
    kwargs: dict[str, Any] = {
        "allowed_paths": [str(backend.output_dir)],
        "blocked_paths": [str(backend.uploads_dir)],  # inside the output folder, but only results are served
        "theme": gr.themes.Default(primary_hue="indigo", secondary_hue="pink"),
        "css": CSS + VIEW_CSS,
        "js": NO_CLAMP_JS,
        "show_error": True,
        "run_history": False,
        "footer_links": ["api", "gradio", "settings"],
        "mcp_server": mcp,
    }
    limit = backend.policy.max_remote_bytes if backend.hosted else None
    if limit:
        kwargs["max_file_size"] = int(limit)
    if backend.hosted:
        kwargs["enable_monitoring"] = False  # /monitoring/summary would show every visitor's traffic
    return kwargs
