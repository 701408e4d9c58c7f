"""Layout and wiring of the "Find on the Hub" panel: a search box, a results table (one row per weight file), a
Check button; picking a row fills adapter 1 and runs its Inspect (the preview), whose answer marks the row ✓/✗.

Every event here is private (no API endpoint) and cheap: the search and the checks queue under their own
concurrency id (counted per visitor in hosted mode, ``hosting/join_bound.py``); filling the slot runs off the queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import gradio as gr

from ...adapters.source.search import DEFAULT_SORT, SORTS
from ..adapter.events import AdapterEvents
from ..adapter.panel import INSPECTED, AdapterSlot, inspect_event, inspect_outputs, slot_inputs
from ..change_events import CHEAP
from ..forms import field_names, parts, write
from ..presenters import render
from .events import COLUMN_WIDTHS, COLUMNS, HubEvents, HubPick, SearchView


class HubEventOptions(TypedDict):
    """The keyword arguments every Hub event is registered with (Gradio's event listener parameters)."""

    api_visibility: Literal["public", "private", "undocumented"]
    concurrency_id: str
    concurrency_limit: int


HUB_EVENTS: HubEventOptions = {"api_visibility": "private", "concurrency_id": "hub", "concurrency_limit": 4}


@dataclass
class HubPanel:
    """The components of the panel."""

    query: gr.Textbox
    sort: gr.Dropdown
    search_button: gr.Button
    check_button: gr.Button
    note: gr.HTML
    table: gr.Dataframe
    rows: gr.State
    picked: gr.State


def build_hub_panel() -> HubPanel:
    """Lay out the panel (inside the current Blocks context), folded until opened."""
    with gr.Accordion("Find on the Hub", open=False, elem_id="hub-panel"):
        with gr.Row(equal_height=True):
            query = gr.Textbox(label="Search MiniMax-H3 adapters", placeholder="e.g. turbo (empty: all)", scale=4,
                               max_lines=1, elem_id="hub-query")
            sort = gr.Dropdown(list(SORTS), value=DEFAULT_SORT, label="Sort by", scale=1, min_width=120,
                               elem_id="hub-sort")
            search_button = gr.Button("Search the Hub", variant="secondary", scale=1, min_width=120,
                                      elem_id="hub-search")
            check_button = gr.Button("Check files (header only)", variant="secondary", scale=1, min_width=120,
                                     elem_id="hub-check")
        note = gr.HTML(render.placeholder("Lists the Hub's adapters of MiniMax-H3 with their weight files; pick a "
                                          "row to preview it in adapter 1."), elem_id="hub-note")
        results = gr.Dataframe(headers=COLUMNS, interactive=False, wrap=True, column_widths=COLUMN_WIDTHS,
                               elem_id="hub-results")
    return HubPanel(query, sort, search_button, check_button, note, results, gr.State([]), gr.State(None))


def _shown(panel: HubPanel) -> dict[str, Any]:
    return parts(panel, field_names(SearchView))


def wire_hub_panel(events: HubEvents, panel: HubPanel, adapters: AdapterEvents, slot: AdapterSlot,
                   token: gr.Textbox, workflow: gr.Radio) -> None:
    """Bind search, Check and the pick into ``slot`` (its own Inspect, on ``adapters``, runs after the pick)."""
    shown = _shown(panel)

    def search(query: str, sort: str, token_value: str, workflow_value: str) -> dict[Any, Any]:
        return write(events.search_view(query, sort, token_value, workflow_value), shown)

    gr.on([panel.search_button.click, panel.query.submit], search, [panel.query, panel.sort, token, workflow],
          list(shown.values()), **HUB_EVENTS)

    def check(rows: list[dict[str, Any]], token_value: str, workflow_value: str) -> dict[Any, Any]:
        return write(events.check_rows(rows, token_value, workflow_value), shown)

    panel.check_button.click(check, [panel.rows, token, workflow], list(shown.values()), **HUB_EVENTS)
    pick_parts = {**parts(slot, field_names(HubPick)), "picked": panel.picked}

    def pick(rows: list[dict[str, Any]], selected: gr.SelectData) -> dict[Any, Any]:
        index = selected.index[0] if isinstance(selected.index, (list, tuple)) else selected.index
        return {**write(events.pick(rows, index), parts(slot, field_names(HubPick))), panel.picked: index}

    inspect_inputs = {*slot_inputs(slot).values(), token, workflow, slot.info}
    picked = panel.table.select(pick, [panel.rows], list(pick_parts.values()), **CHEAP)
    previewed = picked.success(inspect_event(adapters, slot, token, workflow), inspect_inputs, inspect_outputs(slot),
                               **INSPECTED)

    def mark(rows: list[dict[str, Any]], index: int | None, info: dict[str, Any] | None,
             refusal: str | None) -> dict[Any, Any]:
        view = events.mark(rows, index, info, refusal)
        return gr.skip() if view is None else write(view, {"rows": panel.rows, "table": panel.table})

    previewed.then(mark, [panel.rows, panel.picked, slot.info, slot.refused], [panel.rows, panel.table], **CHEAP)


__all__ = ["HubPanel", "build_hub_panel", "wire_hub_panel"]
