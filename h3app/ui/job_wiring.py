"""Wiring of the jobs (Generate, Equivalence, Grid), History and settings files: each event reads its forms from
Gradio's ``{component: value}`` and writes its view back by field name (see :mod:`h3app.ui.forms`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr
from gradio.blocks import Block
from gradio.events import Dependency

from ..backend.preview import PreviewBoard
from ..backend.worker import Progress
from ..errors import H3AppError
from ..hosting.gpu_gate import admitted, gpu_events
from .adapter.events import AdapterEvents
from .adapter.panel import INSPECTED, AdapterSlot, inspect_event, inspect_outputs, slot_inputs
from .change_events import CHEAP, ChangeEvents
from .compare.events import CheckPairView, CheckView, CompareView, ComparisonEvents, HistoryView
from .compare.tabs import EquivalenceTab, GridTab, HistoryTab, JobControls
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
from .generate.events import (
    NOT_RUN,
    GenerateEvents,
    GenerateView,
    Stopped,
    apply_note,
    refusal_status,
    request_problem,
    stale_refusals,
)
from .generate.preview_stream import (
    PAGE_PREVIEW_BUDGET,
    PREVIEW_OFF,
    CheckPreviews,
    GeneratePreview,
    SentImages,
    check_finished,
    check_update,
    generate_finished,
    generate_update,
    preview_toggled,
)
from .generate.settings_file import load_settings_view
from .generate.tab import GenerateTab, RequestControls
from .session import Session

RESTORED_REQUEST = ("workflow", "prompt", "seed", "randomize", "steps", "duration", "height", "width", "shift",
                    "audio_shift", "cache")
COMPARE_LIMIT = 2  # history compares decode two mp4s to float32 each: bounded, on their own queue id

Values = dict[Block, Any]  # Gradio's {component: value}: an event's inputs given as a set, or its answer
# What runs when a page loads: (function, inputs, outputs)
PageLoad = tuple[Callable[..., Any], Sequence[Block], Sequence[Block]]


class JobWiring:
    """Reads a job's forms from Gradio's ``{component: value}``, by field name, and binds the jobs' events: one
    method per event family. ``page_loaded`` collects the (function, inputs, outputs) to run when a page loads."""

    def __init__(self, session: gr.State, mode: gr.Radio, token: gr.Textbox, request: RequestControls,
                 slots: Sequence[AdapterSlot], tabs: JobTabs, events: JobEvents, changes: ChangeEvents,
                 preview_budget: float | None = PAGE_PREVIEW_BUDGET) -> None:
        self.session, self.mode, self.token, self.slots = session, mode, token, list(slots)
        self.preview_budget = preview_budget  # the share of a run's time its previews may take (None: every step)
        self.request = request
        self.request_parts = parts(request, REQUEST_FIELDS)
        self.tabs, self.events, self.changes = tabs, events, changes
        self.history_parts = parts(tabs.history, field_names(HistoryView))
        self.grid_parts = parts(tabs.grid, field_names(GridForm))
        self.gpu = {**gpu_events(events.generate.backend), "api_visibility": "private"}
        self.page_loaded: list[PageLoad] = []

    # ------------------------------------------------------------------------------------------------ forms
    def sync_inputs(self) -> set[Block]:
        return {self.session, self.mode, *(c for slot in self.slots for c in slot_inputs(slot).values())}

    def sync_form(self, values: Mapping[Block, Any]) -> SyncForm:
        return SyncForm(values[self.session], values[self.mode],
                        {slot.slot: read(SlotForm, slot_inputs(slot), values) for slot in self.slots})

    def job_inputs(self, *extra: Block) -> set[Block]:
        return {self.session, self.mode, self.token, *self.request_parts.values(), *extra}

    def job_form(self, values: Mapping[Block, Any]) -> JobForm:
        return JobForm(values[self.session], values[self.mode], read(RequestForm, self.request_parts, values),
                       values[self.token])

    # ------------------------------------------------------------------------------------- shared handlers
    def start_inputs(self) -> set[Block]:
        """What a job's click judges before it starts: the panel and the request's values."""
        return {*self.sync_inputs(), *self.request_parts.values()}

    def request_refused(self, values: Values) -> bool:
        """The request's numbers hold a value its note under Steps refuses (``request_problem``)."""
        limits = self.events.generate.backend.limits
        return request_problem(read(RequestForm, self.request_parts, values), limits) is not None

    def sync(self, values: Values, request: gr.Request | None = None) -> Session:
        """The panel's controls → the session's adapters, right before a job; the click counts as expected. A value
        already refused on the page stops it here without a pop-up: the failure's status line points to that
        value's own line (:meth:`refused`), so the page says it once."""
        if self.request_refused(values):
            raise gr.Error(NOT_RUN, visible=False, print_exception=False)
        try:
            session_value = self.events.adapters.sync_session(self.sync_form(values))
        except gr.Error as error:
            raise gr.Error(error.message, visible=False, print_exception=False) from error
        self.events.generate.runner.expect(request)
        return session_value

    def refused(self, values: Values, above: bool = False) -> str:
        return refusal_status(self.sync_form(values), self.request_refused(values), above)

    def show_history(self, session_value: Session | None) -> Values:
        return write(self.events.comparisons.history_view(session_value), self.history_parts)

    def grid_axes_pass(self, values: Values) -> bool:
        """The Grid's axes as typed make a plan (else its estimate line says why)."""
        try:
            self.events.comparisons.plan(read(GridForm, self.grid_parts, values))
        except (H3AppError, ValueError):
            return False
        return True

    def start(self, button: gr.Button, status: gr.Markdown, run: Callable[..., Iterator[Values]],
              inputs: set[Block], outputs: list[Block], above: bool = False, **options: Any) -> Dependency:
        """A job's click: sync the panel (queued: a queue-less event's error is an HTTP 500 the page does not
        show; a refusal stops the chain with no pop-up and the status line says where the page says why —
        ``above``: the line above the button), then the job, admitted in front of the GPU; the history follows."""
        synced = button.click(self.sync, self.start_inputs(), [self.session], **{**CHEAP, "queue": True})
        # in the page's order: a redraw sent before the click (it clears a job's old refusal) cannot clear this one
        self.changes.listen(synced.failure, lambda values: {status: self.refused(values, above)}, self.start_inputs(),
                            [status], **CHEAP)
        job = synced.success(admitted(run, self.events.generate.backend), inputs, outputs, **options, **self.gpu)
        job.then(self.show_history, [self.session], list(self.history_parts.values()), **CHEAP)
        return job

    # ------------------------------------------------------------------------------------------ the events
    def wire_apply_note(self) -> None:
        """The line above Generate: what the next run applies, redrawn as the panel changes."""

        def note(values: Values) -> str:
            return apply_note(self.sync_form(values))

        triggers = [trigger for slot in self.slots
                    for trigger in (slot.source.change, slot.weight.change, slot.revision.change, slot.refused.change,
                                    slot.override.change, slot.alpha.change, slot.strength.change,
                                    *(control.change for control in slot.advanced.parts.values()))]
        self.changes.on(triggers + [self.session.change, self.mode.change], note, self.sync_inputs(),
                        [self.tabs.generate.apply_note])

    def wire_stale_refusals(self) -> None:
        """A job's refusal in a tab's status line goes the moment an input it judged changes (the refused value's own
        line, at its control, says whether it still is)."""
        statuses = {self.tabs.generate.status, self.tabs.equivalence.status, self.tabs.grid.status}
        controls = [*self.request_parts.values(), self.mode,
                    *(c for slot in self.slots for c in slot_inputs(slot).values()),
                    self.tabs.grid.alphas, self.tabs.grid.scales, self.tabs.grid.seeds]
        triggers = [c.change for c in dict.fromkeys(controls) if hasattr(c, "change")]
        self.changes.on(triggers, stale_refusals, statuses, list(statuses))

    def wire_generate(self) -> Dependency:
        generate, seed = self.tabs.generate, self.request.seed
        slot_1, slot_2 = self.slots
        generate_parts = {**parts(generate, [n for n in field_names(GenerateView) if n not in ("seed", "session")]),
                          "seed": seed, "session": self.session}

        live = GeneratePreview(generate.preview, generate.preview_note)

        def run_generate(values: Values, request: gr.Request | None = None,
                         progress: gr.Progress = gr.Progress()) -> Iterator[Values]:
            board = PreviewBoard(budget=self.preview_budget)  # this request's previews, streamed to this page only
            on = values[generate.step_preview] is not False
            views = self.events.generate.generate_views(self.job_form(values), (values[slot_1.info],
                                                        values[slot_2.info]), request, progress, board, on)
            yield from streamed_reply(generate.status, generate_parts, views,
                                      lambda now: generate_update(live, board, now),
                                      lambda stopped: (generate_finished(live, board, stopped) if on
                                                       else {live.preview_note: PREVIEW_OFF}))

        generate.step_preview.change(preview_toggled, [generate.step_preview], [generate.preview_note], **CHEAP)
        generated = self.start(generate.generate_button, generate.status, run_generate,
                               self.job_inputs(slot_1.info, slot_2.info, generate.step_preview),
                               [*generate_parts.values(), generate.status, generate.preview, generate.preview_note],
                               above=True, scroll_to_output=False, show_progress_on=[generate.video])
        return generated

    def wire_check_pair(self) -> None:
        """A and B follow adapter 1's alpha in use and rank (the person may type any pair afterwards)."""
        slot_1, suggested = self.slots[0], gr.State(None)
        pair_parts = {**parts(self.tabs.equivalence, [n for n in field_names(CheckPairView) if n != "suggested"]),
                      "suggested": suggested}

        def check_pair(info: dict[str, Any] | None, override: bool, alpha_text: str | float | None,
                       last: list[float] | None) -> Values:
            return write(self.events.comparisons.check_pair(info, override, alpha_text, last), pair_parts)

        pair_inputs = [slot_1.info, slot_1.override, slot_1.alpha, suggested]
        self.changes.on([slot_1.info.change, slot_1.override.change, slot_1.alpha.change], check_pair, pair_inputs,
                        list(pair_parts.values()))
        self.page_loaded.append((check_pair, pair_inputs, list(pair_parts.values())))

    def wire_check(self) -> Dependency:
        equivalence = self.tabs.equivalence
        check_parts = parts(equivalence, field_names(CheckForm))
        check_outputs = {**parts(equivalence, [n for n in field_names(CheckView) if n != "session"]),
                         "session": self.session}

        live = CheckPreviews(equivalence.preview_a, equivalence.preview_b, equivalence.preview_fallback,
                             equivalence.preview_note)

        def run_check(values: Values, request: gr.Request | None = None,
                      progress: gr.Progress = gr.Progress()) -> Iterator[Values]:
            board = PreviewBoard(budget=self.preview_budget)  # A, B and the fallback, streamed to this page only
            views = self.events.comparisons.check_views(self.job_form(values), read(CheckForm, check_parts, values),
                                                        request, progress, board)
            yield from streamed_reply(equivalence.status, check_outputs, views,
                                      lambda now: check_update(live, board, now),
                                      lambda stopped: check_finished(live, board, stopped))

        def values_note(values: Values) -> str:
            return self.events.comparisons.check_values_note(read(CheckForm, check_parts, values))

        self.changes.on([c.change for c in check_parts.values()], values_note, set(check_parts.values()),
                        [equivalence.status])
        checked = self.start(equivalence.run_button, equivalence.status, run_check,
                             self.job_inputs(*check_parts.values()),
                             [*check_outputs.values(), equivalence.status, *vars(live).values()],
                             show_progress_on=[equivalence.verdict])
        return checked

    def wire_grid(self) -> Dependency:
        grid = self.tabs.grid
        grid_outputs = {**parts(grid, ["view", "table", "status", "cells"]), "session": self.session}

        def run_grid(values: Values, request: gr.Request | None = None,
                     progress: gr.Progress = gr.Progress()) -> Iterator[Values]:
            try:
                for view in self.events.comparisons.grid_view(self.job_form(values),
                                                              read(GridForm, self.grid_parts, values), request,
                                                              progress):
                    yield write(view, grid_outputs)
            except gr.Error as error:  # refused axes: the estimate above Run says why, once
                yield (refused_job(grid.status, error) if self.grid_axes_pass(values)
                       else {grid.status: f"{NOT_RUN}: an axis is refused (the line above Run says why)."})

        gridded = self.start(grid.run_button, grid.status, run_grid, self.job_inputs(*self.grid_parts.values()),
                             list(grid_outputs.values()), show_progress_on=[grid.view])
        return gridded

    def wire_compare(self) -> None:
        """History's Compare: decodes two mp4s, on its own bounded queue id."""
        history = self.tabs.history
        compare_parts = parts(history, field_names(CompareView))

        def compare(session_value: Session | None, a_id: str | None, b_id: str | None) -> Values:
            return write(self.events.comparisons.compare(session_value, a_id, b_id), compare_parts)

        history.compare_button.click(compare, [self.session, history.pick_a, history.pick_b],
                                     list(compare_parts.values()), api_visibility="private",
                                     concurrency_id="compare", concurrency_limit=COMPARE_LIMIT)

    def wire_cancel(self, tab: GenerateTab | JobControls, job: Dependency) -> None:
        """Cancel asks the worker to stop the session's job at its next step; the job's own event then reports
        "Cancelled after k of n steps" (Gradio's ``cancels=`` would kill the event and lose that answer).
        "Cancelling …" goes to its own line: the job's final answer may reach the page before the click's reply."""
        tab.cancel_button.click(self.events.generate.runner.cancel, None, [tab.cancel_note], **CHEAP)
        job.then(lambda: "", None, [tab.cancel_note], **CHEAP)


@dataclass(frozen=True)
class JobTabs:
    """The tabs whose events :class:`JobWiring` binds."""

    generate: GenerateTab
    equivalence: EquivalenceTab
    grid: GridTab
    history: HistoryTab


@dataclass(frozen=True)
class JobEvents:
    """The event functions those tabs call."""

    adapters: AdapterEvents
    generate: GenerateEvents
    comparisons: ComparisonEvents


def wire_jobs(session: gr.State, mode: gr.Radio, token: gr.Textbox, slots: Sequence[AdapterSlot],
              request: RequestControls, generate: GenerateTab, equivalence: EquivalenceTab, grid: GridTab,
              history: HistoryTab, adapter_events: AdapterEvents, generate_events: GenerateEvents,
              comparisons: ComparisonEvents, changes: ChangeEvents,
              preview_budget: float | None = PAGE_PREVIEW_BUDGET) -> list[PageLoad]:
    """Bind Generate, Equivalence, Grid, History, Cancel and settings files. Returns the (function, inputs,
    outputs) to run when a page loads."""
    jobs = JobWiring(session, mode, token, request, slots, JobTabs(generate, equivalence, grid, history),
                     JobEvents(adapter_events, generate_events, comparisons), changes, preview_budget)
    jobs.wire_apply_note()
    jobs.wire_stale_refusals()
    generated = jobs.wire_generate()
    jobs.wire_check_pair()
    checked = jobs.wire_check()
    gridded = jobs.wire_grid()
    jobs.wire_compare()
    tab_jobs: tuple[tuple[GenerateTab | JobControls, Dependency], ...] = (
        (generate, generated), (equivalence, checked), (grid, gridded))
    for tab, job in tab_jobs:
        jobs.wire_cancel(tab, job)
    _wire_settings_file(jobs, generate, adapter_events, token, request)
    return jobs.page_loaded


def job_reply(status: gr.Markdown, outputs: dict[str, Block], view_of: Callable[[], Any]) -> Values:
    """The answer of a one-shot job event: its view written to ``outputs`` and an empty status line; a refusal's
    line (:func:`refused_job`); or a stopped job's "Cancelled after k of n steps"."""
    try:
        view = view_of()
    except gr.Error as error:
        return refused_job(status, error)
    if isinstance(view, Stopped):
        return {status: view.status}
    return {**write(view, outputs), status: ""}


def streamed_reply(status: gr.Markdown, outputs: dict[str, Block], views: Iterator[Any],
                   shown: Callable[[Progress], Values], finished: Callable[[bool], Values]) -> Iterator[Values]:
    """The answers of a job event that streams step previews: ``shown(progress)`` while the job runs, then (as
    :func:`job_reply`) its view written to ``outputs`` or the stopped / refused line, with ``finished(stopped)``."""
    view, sent = None, SentImages()  # each preview image reaches the page once
    try:
        for item in views:
            if isinstance(item, Progress):
                yield sent.only_new(shown(item))
            else:
                view = item
    except gr.Error as error:
        yield refused_job(status, error)
        return
    if isinstance(view, Stopped):
        yield {status: view.status, **sent.only_new(finished(True))}
    else:
        yield {**write(view, outputs), status: "", **sent.only_new(finished(False))}


def refused_job(status: gr.Markdown, error: gr.Error) -> Values:
    """A job the backend refused: its one line where the result would appear, no pop-up repeating it and no error
    badge left on the output (the event ends normally); an input's change clears it (``stale_refusals``)."""
    return {status: f"{NOT_RUN}: {error.message}"}


def _wire_settings_file(jobs: JobWiring, generate: GenerateTab, adapter_events: AdapterEvents, token: gr.Textbox,
                        request: RequestControls) -> None:
    """Load settings from a .json or an mp4: restore the controls, then inspect each restored slot."""
    slot_parts = {slot.slot: slot_inputs(slot) for slot in jobs.slots}
    restored_request = {name: jobs.request_parts[name] for name in RESTORED_REQUEST}
    outputs = [*restored_request.values(), jobs.mode, *(c for p in slot_parts.values() for c in p.values()),
               generate.load_status]

    def restore(path: str | None) -> Values:
        view = load_settings_view(path)
        shown = {**write(view.request, restored_request), jobs.mode: view.mode,
                 generate.load_status: view.load_status}
        for name, slot in view.slots.items():
            shown.update(_slot_values(slot_parts[name], slot))
        return shown

    restored = generate.settings_file.upload(restore, [generate.settings_file], outputs, **CHEAP)
    for slot in jobs.slots:
        inspect = inspect_event(adapter_events, slot, token, request.workflow)

        def quiet_inspect(values: Values, slot: AdapterSlot = slot, inspect: Callable[[Values], Any] = inspect) -> Any:
            """An empty restored slot stays as it is."""
            return inspect(values) if values[slot.source] else gr.skip()

        restored.success(quiet_inspect, {*slot_inputs(slot).values(), token, request.workflow},
                         inspect_outputs(slot), **INSPECTED)


def _slot_values(components: Mapping[str, Block], slot: SlotForm | None) -> Values:
    """A restored slot's control values (None empties the slot); the weight dropdown lists just that file."""
    slot = slot or SlotForm(alpha="")
    values = {components[name]: getattr(slot, name) for name in ("source", "revision", "override", "alpha",
                                                                  "strength")}
    values.update({components[name]: value for name, value in slot.advanced.values.items()})
    values[components["weight"]] = gr.update(choices=[slot.weight] if slot.weight else [], value=slot.weight)
    return values
