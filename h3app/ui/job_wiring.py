"""Wiring of the jobs (Generate, Equivalence, Grid), History and settings files: each event reads its forms from
Gradio's ``{component: value}`` and writes its view back by field name (see :mod:`h3app.ui.forms`)."""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

import gradio as gr

from .adapter_events import AdapterEvents, InspectView
from .adapter_panel import CHEAP, AdapterSlot, inspect_event, slot_inputs
from .comparison_events import CheckPairView, CheckView, CompareView, ComparisonEvents, HistoryView
from .forms import (
    REQUEST_FIELDS,
    CheckForm,
    GridForm,
    JobForm,
    RequestForm,
    SlotForm,
    SyncForm,
    field_names,
    parts,
    read,
    write,
)
from .generate_events import GenerateEvents, GenerateView, Stopped, apply_note, load_settings_view, refusal_status
from .fair_queue import admitted, gpu_events
from .generate_tab import RequestControls

RESTORED_REQUEST = ("workflow", "prompt", "seed", "randomize", "steps", "duration", "height", "width", "shift",
                    "audio_shift")
COMPARE_LIMIT = 2  # history compares decode two mp4s to float32 each: bounded, on their own queue id


class JobWiring:
    """Reads a job's forms from Gradio's ``{component: value}``, by field name."""

    def __init__(self, session: gr.State, mode: gr.Radio, token: gr.Textbox, request: RequestControls,
                 slots: Sequence[AdapterSlot]) -> None:
        self.session, self.mode, self.token, self.slots = session, mode, token, list(slots)
        self.request_parts = parts(request, REQUEST_FIELDS)

    def sync_inputs(self) -> set[Any]:
        return {self.session, self.mode, *(c for slot in self.slots for c in slot_inputs(slot).values())}

    def sync_form(self, values: Mapping[Any, Any]) -> SyncForm:
        return SyncForm(values[self.session], values[self.mode],
                        {slot.slot: read(SlotForm, slot_inputs(slot), values) for slot in self.slots})

    def job_inputs(self, *extra: Any) -> set[Any]:
        return {self.session, self.mode, self.token, *self.request_parts.values(), *extra}

    def job_form(self, values: Mapping[Any, Any]) -> JobForm:
        return JobForm(values[self.session], values[self.mode], read(RequestForm, self.request_parts, values),
                       values[self.token])


def wire_jobs(session: gr.State, mode: gr.Radio, token: gr.Textbox, slots: Sequence[AdapterSlot],
              request: RequestControls, generate: Any, equivalence: Any, grid: Any, history: Any,
              adapter_events: AdapterEvents, generate_events: GenerateEvents, comparisons: ComparisonEvents
              ) -> list[tuple[Any, Any, Any]]:
    """Bind Generate, Equivalence, Grid, History, Cancel and settings files. Returns the (function, inputs,
    outputs) to run when a page loads."""
    page_loaded: list[tuple[Any, Any, Any]] = []
    jobs = JobWiring(session, mode, token, request, slots)
    slot_1, slot_2 = slots
    history_parts = parts(history, field_names(HistoryView))
    grid_parts = parts(grid, field_names(GridForm))
    backend = generate_events.backend
    gpu = {**gpu_events(backend), "api_visibility": "private"}

    def sync(values: dict[Any, Any], request: gr.Request = None) -> dict[str, Any]:
        session_value = adapter_events.sync_session(jobs.sync_form(values))
        generate_events.runner.expect(request)
        return session_value

    def note(values: dict[Any, Any]) -> str:
        return apply_note(jobs.sync_form(values))

    gr.on([trigger for slot in slots for trigger in (slot.source.change, slot.weight.change, slot.revision.change,
                                                     slot.refused.change,
                                                     slot.override.change, slot.alpha.change, slot.strength.change)]
          + [session.change, mode.change], note, jobs.sync_inputs(), [generate.apply_note], **CHEAP)

    def show_history(session_value: dict[str, Any] | None) -> dict[Any, Any]:
        return write(comparisons.history_view(session_value), history_parts)

    def estimate(values: dict[Any, Any]) -> str:
        return comparisons.estimate(read(GridForm, grid_parts, values))

    generate_parts = {**parts(generate, [n for n in field_names(GenerateView) if n not in ("seed", "session")]),
                      "seed": request.seed, "session": session}

    def run_generate(values: dict[Any, Any], request: gr.Request = None, progress: Any = gr.Progress()
                     ) -> dict[Any, Any]:
        try:
            view = generate_events.generate_view(jobs.job_form(values), (values[slot_1.info], values[slot_2.info]),
                                                 request, progress)
        except gr.Error as error:
            return refused_job(generate.status, error)
        if isinstance(view, Stopped):
            return {generate.status: view.status}
        return {**write(view, generate_parts), generate.status: ""}

    # The sync is queued: a refusal then reaches the page as one pop-up (a queue-less event's error is an HTTP 500
    # the page does not show), and the line where the result would appear says why nothing ran.
    synced = {**CHEAP, "queue": True}

    def refused(values: dict[Any, Any]) -> str:
        return refusal_status(jobs.sync_form(values))

    generated = generate.generate_button.click(sync, jobs.sync_inputs(), [session], **synced)
    generated.failure(refused, jobs.sync_inputs(), [generate.status], **CHEAP)
    generated = generated.success(
        admitted(run_generate, backend), jobs.job_inputs(slot_1.info, slot_2.info),
        [*generate_parts.values(), generate.status],
        scroll_to_output=False, show_progress_on=[generate.video], **gpu)
    generated.then(show_history, [session], list(history_parts.values()), **CHEAP)
    generated.then(estimate, set(grid_parts.values()), [grid.estimate], **CHEAP)

    check_parts = parts(equivalence, field_names(CheckForm))
    check_outputs = {**parts(equivalence, [n for n in field_names(CheckView) if n != "session"]), "session": session}

    def run_check(values: dict[Any, Any], request: gr.Request = None, progress: Any = gr.Progress()
                  ) -> dict[Any, Any]:
        try:
            view = comparisons.check_view(jobs.job_form(values), read(CheckForm, check_parts, values), request,
                                          progress)
        except gr.Error as error:
            return refused_job(equivalence.status, error)
        if isinstance(view, Stopped):
            return {equivalence.status: view.status}
        return {**write(view, check_outputs), equivalence.status: ""}

    def check_estimate(values: dict[Any, Any]) -> str:
        return comparisons.check_estimate(read(RequestForm, jobs.request_parts, values))

    request_changes = [getattr(request, name).change for name in ("steps", "duration", "height", "width", "prompt",
                                                                  "workflow")]
    estimated = [equivalence.estimate]
    gr.on(request_changes, check_estimate, set(jobs.request_parts.values()), estimated, **CHEAP)
    page_loaded.append((check_estimate, set(jobs.request_parts.values()), estimated))
    generated.then(check_estimate, set(jobs.request_parts.values()), estimated, **CHEAP)

    # A and B follow adapter 1's alpha in use and rank (the person may type any pair afterwards)
    pair_parts = parts(equivalence, field_names(CheckPairView))

    def check_pair(info: dict[str, Any] | None, override: bool, alpha_text: Any) -> dict[Any, Any]:
        return write(comparisons.check_pair(info, override, alpha_text), pair_parts)

    pair_inputs = [slot_1.info, slot_1.override, slot_1.alpha]
    gr.on([slot_1.info.change, slot_1.override.change, slot_1.alpha.change], check_pair, pair_inputs,
          list(pair_parts.values()), **CHEAP)
    page_loaded.append((check_pair, pair_inputs, list(pair_parts.values())))

    checked = equivalence.run_button.click(sync, jobs.sync_inputs(), [session], **synced)
    checked.failure(refused, jobs.sync_inputs(), [equivalence.status], **CHEAP)
    checked = checked.success(
        admitted(run_check, backend), jobs.job_inputs(*check_parts.values()),
        [*check_outputs.values(), equivalence.status],
        show_progress_on=[equivalence.verdict], **gpu)
    checked.then(show_history, [session], list(history_parts.values()), **CHEAP)
    checked.then(check_estimate, set(jobs.request_parts.values()), estimated, **CHEAP)

    grid_outputs = {**parts(grid, ["view", "table", "status", "cells"]), "session": session}

    def run_grid(values: dict[Any, Any], request: gr.Request = None, progress: Any = gr.Progress()
                 ) -> Iterator[dict[Any, Any]]:
        try:
            for view in comparisons.grid_view(jobs.job_form(values), read(GridForm, grid_parts, values), request,
                                              progress):
                yield write(view, grid_outputs)
        except gr.Error as error:
            yield refused_job(grid.status, error)

    gridded = grid.run_button.click(sync, jobs.sync_inputs(), [session], **synced)
    gridded.failure(refused, jobs.sync_inputs(), [grid.status], **CHEAP)
    gridded = gridded.success(
        admitted(run_grid, backend), jobs.job_inputs(*grid_parts.values()), list(grid_outputs.values()),
        show_progress_on=[grid.view], **gpu)
    gridded.then(show_history, [session], list(history_parts.values()), **CHEAP)
    gridded.then(estimate, set(grid_parts.values()), [grid.estimate], **CHEAP)
    gr.on([grid.alphas.change, grid.scales.change, grid.seeds.change], estimate, set(grid_parts.values()),
          [grid.estimate], **CHEAP)

    compare_parts = parts(history, field_names(CompareView))

    def compare(session_value: dict[str, Any] | None, a_id: str | None, b_id: str | None) -> dict[Any, Any]:
        return write(comparisons.compare(session_value, a_id, b_id), compare_parts)

    history.compare_button.click(compare, [session, history.pick_a, history.pick_b], list(compare_parts.values()),
                                 api_visibility="private", concurrency_id="compare", concurrency_limit=COMPARE_LIMIT)

    # Cancel asks the worker to stop the session's job at its next step; the job's own event then reports
    # "Cancelled after k of n steps" (Gradio's `cancels=` would kill the event and lose that answer)
    # "Cancelling …" goes to its own line: the job's final answer may reach the page before the click's reply
    for button, note, job in ((generate.cancel_button, generate.cancel_note, generated),
                              (equivalence.cancel_button, equivalence.cancel_note, checked),
                              (grid.cancel_button, grid.cancel_note, gridded)):
        button.click(generate_events.runner.cancel, None, [note], **CHEAP)
        job.then(lambda: "", None, [note], **CHEAP)

    _wire_settings_file(jobs, generate, adapter_events, token, request)
    return page_loaded


def refused_job(status: Any, error: gr.Error) -> dict[Any, Any]:
    """A job the backend refused: its one line where the result would appear and one pop-up — no error badge left
    on the output (the event ends normally)."""
    gr.Warning(error.message)
    return {status: f"✖ {error.message}"}


def _wire_settings_file(jobs: JobWiring, generate: Any, adapter_events: AdapterEvents, token: gr.Textbox,
                        request: RequestControls) -> None:
    """Load settings from a .json or an mp4: restore the controls, then inspect each restored slot."""
    slot_parts = {slot.slot: slot_inputs(slot) for slot in jobs.slots}
    restored_request = {name: jobs.request_parts[name] for name in RESTORED_REQUEST}
    outputs = [*restored_request.values(), jobs.mode, *(c for p in slot_parts.values() for c in p.values()),
               generate.load_status]

    def restore(path: str | None) -> dict[Any, Any]:
        view = load_settings_view(path)
        shown = {**write(view.request, restored_request), jobs.mode: view.mode,
                 generate.load_status: view.load_status}
        for name, slot in view.slots.items():
            shown.update(_slot_values(slot_parts[name], slot))
        return shown

    restored = generate.settings_file.upload(restore, [generate.settings_file], outputs, **CHEAP)
    for slot in jobs.slots:
        inspect = inspect_event(adapter_events, slot, token, request.workflow)

        def quiet_inspect(values: dict[Any, Any], slot: AdapterSlot = slot, inspect: Any = inspect) -> Any:
            """An empty restored slot stays as it is."""
            return inspect(values) if values[slot.source] else gr.skip()

        restored.success(quiet_inspect, {*slot_inputs(slot).values(), token, request.workflow},
                         [*parts(slot, field_names(InspectView)).values(), slot.weight, slot.basis, slot.report_html,
                          slot.profile_box, slot.refused], api_visibility="private", concurrency_id="inspect",
                         concurrency_limit=4)


def _slot_values(components: Mapping[str, Any], slot: SlotForm | None) -> dict[Any, Any]:
    """A restored slot's control values (None empties the slot); the weight dropdown lists just that file."""
    slot = slot or SlotForm(alpha="")
    values = {components[name]: getattr(slot, name) for name in ("source", "revision", "override", "alpha",
                                                                  "strength")}
    values[components["weight"]] = gr.update(choices=[slot.weight] if slot.weight else [], value=slot.weight)
    return values
