"""The ordering rule of the page's answers (h3app/ui/change_events.py, ``AnswerOrder``; the numbering:
h3app/ui/gradio_compat.py, ``sent_order``): per page, each output shows the answer of the newest event that wrote it,
"newest" being the one that reached the server last. The race in a real browser: tests/test_ui_events_in_order_browser.py."""

from __future__ import annotations

import inspect
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import gradio as gr
import httpx
from polling import wait_until

from h3app.ui import change_events
from h3app.ui.change_events import AnswerOrder, ChangeEvents
from h3app.ui.gradio_compat import hook_queue, sent_order

SKIP = gr.skip()


def test_an_older_answer_leaves_alone_each_output_a_newer_one_wrote():
    with gr.Blocks():
        note, card, other = gr.Textbox(), gr.Textbox(), gr.Textbox()
    order = AnswerOrder()
    assert order.kept({note: "newest"}, "page", 5) == {note: "newest"}
    assert order.kept({note: "older", card: "card"}, "page", 3) == {card: "card"}  # note: 5 wrote it already
    assert order.kept({note: "older"}, "page", 4) == SKIP  # nothing left: no update at all
    assert order.kept({note: "later", card: "later"}, "page", 6) == {note: "later", card: "later"}
    assert order.kept({card: "old"}, "page", 5) == SKIP  # 6 wrote the card after 5 was sent
    assert order.kept({note: "another page"}, "other page", 1) == {note: "another page"}  # pages apart
    # an output an event leaves alone (gr.skip()) is not claimed by it: an older answer may still write it
    assert order.kept({other: SKIP, card: "newer"}, "page", 9) == {other: SKIP, card: "newer"}
    assert order.kept({other: "older"}, "page", 8) == {other: "older"}
    assert order.kept({other: "oldest"}, "page", 7) == SKIP


def test_direct_calls_and_plain_values_pass_unchanged_and_old_pages_are_forgotten():
    with gr.Blocks():
        note = gr.Textbox()
    order = AnswerOrder(pages=2)
    order.kept({note: "x"}, "p1", 10)
    assert order.kept({note: "y"}, None, 1) == {note: "y"}  # no page: a direct call (a test, the API's own code)
    assert order.kept({note: "y"}, "p1", None) == {note: "y"}  # no number: not an event of a hooked app
    assert order.kept("plain", "p1", 1) == "plain" and order.kept(SKIP, "p1", 1) == SKIP
    assert order.kept({"a": "JSON value"}, "p1", 1) == {"a": "JSON value"}  # one output's value, not keyed by outputs
    assert order.kept({note: "y"}, "p1", 1) == SKIP
    order.kept({note: "x"}, "p2", 10)
    order.kept({note: "x"}, "p3", 10)  # at most 2 pages: p1, the oldest, is forgotten
    assert order.kept({note: "y"}, "p1", 1) == {note: "y"}


def test_an_ordered_event_takes_the_page_number_and_else_its_arrival(monkeypatch):
    """The page's own number (the hidden first input, ``SENT_JS``) decides, not the order of arrival; a call that
    carries none (no page script ran) is ordered by its arrival."""
    with gr.Blocks():
        box, note = gr.Textbox(), gr.Textbox()
    changes = ChangeEvents()
    running = {"page": "p", "number": 2}
    monkeypatch.setattr(change_events, "current_request", lambda: SimpleNamespace(session_hash=running["page"]))
    monkeypatch.setattr(change_events, "sent_order", lambda: running["number"])

    def note_for(text: str, request: gr.Request | None = None) -> dict[Any, Any]:
        return {note: text}

    answer, inputs = changes.order.ordered(note_for, [box])
    assert inputs == [box]
    assert answer(5, "sent fifth") == {note: "sent fifth"}
    running["number"] = 99  # reached the server after everything else
    assert answer(4, "sent fourth, arrived last") == SKIP  # the page's order, not the arrival
    assert answer(None, "no page number") == {note: "no page number"}  # arrival 99: the newest
    assert list(inspect.signature(answer).parameters) == ["sent", "input_0", "request"]  # Gradio sees the request


def _post(url: str, demo: gr.Blocks, trigger: Any, values: dict[Any, Any]) -> Any:
    """One queue-less event of ``demo`` as a client without the page's script sends it (``/run/predict``, the event's
    inputs in its order; the page's number, a component not in ``values``, left empty)."""
    index, block_fn = next((i, f) for i, f in demo.fns.items() if f.targets and f.targets[0][0] == trigger._id)
    body = {"data": [values.get(c) for c in block_fn.inputs], "fn_index": index, "session_hash": "page-1",
            "event_data": None, "trigger_id": trigger._id}
    answer = httpx.post(f"{url}gradio_api/run/predict", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["data"]


def test_a_hooked_app_numbers_events_as_they_arrive_and_drops_the_late_older_answer():
    """Two boxes, one note: the first box's event is held on the server until the second's has answered."""
    changes, started, released, seen = ChangeEvents(), threading.Event(), threading.Event(), []

    def held(a: str, b: str) -> str:
        seen.append(sent_order())
        started.set()
        released.wait(10)
        return f"{a}/{b}"

    def at_once(a: str, b: str) -> str:
        seen.append(sent_order())
        return f"{a}/{b}"

    with gr.Blocks() as demo:
        first, second, note = gr.Textbox(), gr.Textbox(), gr.Textbox()
        changes.on([first.change], held, [first, second], [note])
        changes.on([second.change], at_once, [first, second], [note])
        changes.wire()
    demo.queue()
    hook_queue(demo)
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True)
    try:
        with ThreadPoolExecutor(1) as pool:
            late = pool.submit(_post, demo.local_url, demo, first, {first: "x", second: "old"})
            wait_until(started.is_set, "the first event to run")
            assert _post(demo.local_url, demo, second, {first: "x", second: "new"}) == ["x/new"]
            released.set()
            assert late.result() == [SKIP]  # computed from "old", answered last: the note keeps "x/new"
    finally:
        released.set()
        demo.close()
    assert seen[0] is not None and seen[1] > seen[0]  # numbered in the order they reached the server


def test_the_page_number_outranks_the_arrival():
    """What the page sent first but the server read last (two requests racing over two connections; a 5,000-character
    source's clear read after Inspect's join): its answer does not cover the one the page sent after it."""
    changes = ChangeEvents()
    with gr.Blocks() as demo:
        first, second, note = gr.Textbox(), gr.Textbox(), gr.Textbox()
        changes.on([first.change], lambda a, b: f"first: {a}", [first, second], [note])
        changes.on([second.change], lambda a, b: f"second: {b}", [first, second], [note])
        changes.wire()
    demo.queue()
    hook_queue(demo)
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True)
    try:
        stamp = changes.stamp
        assert stamp is not None
        assert _post(demo.local_url, demo, second, {stamp: 2, first: "a", second: "b"}) == ["second: b"]
        assert _post(demo.local_url, demo, first, {stamp: 1, first: "a", second: "b"}) == [SKIP]  # sent first
        assert _post(demo.local_url, demo, first, {stamp: 3, first: "a2", second: "b"}) == ["first: a2"]
    finally:
        demo.close()


def test_a_real_answer_about_a_text_replaces_the_placeholder_about_it_whatever_the_order():
    """The page may send a pasted text's Enter (Inspect) before its input event (the "Source changed" clear): the
    clear is newer but only says the text changed; Inspect's card for that very text replaces it, and a clear never
    covers Inspect's card for its own text. About another text, the order decides as for any answer."""
    with gr.Blocks():
        card = gr.HTML()
    order = AnswerOrder()
    assert order.kept({card: "Source changed"}, "p", 2, about="x" * 5000, placeholder=True) == {card: "Source changed"}
    assert order.kept({card: "refused: 5,000 characters"}, "p", 1, about="x" * 5000) == {card: "refused: 5,000 characters"}
    assert order.kept({card: "Source changed"}, "p", 3, about="x" * 5000, placeholder=True) == SKIP
    assert order.kept({card: "Source changed"}, "p", 4, about="owner/other", placeholder=True) == {card: "Source changed"}
    assert order.kept({card: "card of x…"}, "p", 1, about="x" * 5000) == SKIP  # the text changed since: older, other
