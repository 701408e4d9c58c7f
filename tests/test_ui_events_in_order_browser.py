"""The page's events land in the order they were sent, however long the server takes over each (docs/ui.md, "Events
in order"; h3app/ui/change_events.py, ``AnswerOrder``), in Debian's chromium on the session's app.

A loaded server is made certain here: the first of two events is held on the server (:class:`Held`) until the
second one's answer is on the page, then let go, so its answer arrives last. Typing is as fast as Playwright goes
(``fill``, ``press_sequentially`` without delay). The final text must be the second event's."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from browser_fixtures import answered, inspected, open_tab, pick_demo
from playwright.sync_api import expect
from polling import wait_until

from h3app.adapters.known import TINY_DEMO_DIR
from h3app.ui.adapter import panel
from h3app.ui.adapter.events import AdapterEvents
from h3app.ui.compare.events import ComparisonEvents

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TURBO = "tiny_turbo_4step.safetensors"
HOLD_SECONDS = 30.0  # the longest a held call waits for the test's word: a server thread never hangs


class Held:
    """``fn`` with its first call for which ``when(*args)`` holds kept on the server until :meth:`release`."""

    def __init__(self, fn: Callable[..., Any], when: Callable[..., bool]) -> None:
        self.fn, self.when = fn, when
        self.started, self.finished, self.released = threading.Event(), threading.Event(), threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.started.is_set() or not self.when(*args, **kwargs):
            return self.fn(*args, **kwargs)
        self.started.set()
        try:
            self.released.wait(HOLD_SECONDS)
            return self.fn(*args, **kwargs)
        finally:
            self.finished.set()

    def release(self, page: Any) -> None:
        """Let the held call answer, and wait until the page has had its answer."""
        assert self.started.is_set(), "the held event never reached the server: the race was not run"
        self.released.set()
        wait_until(self.finished.is_set, "the held event to finish", 60)
        answered(page)


def playwright_wait(page: Any) -> Callable[[float], Any]:
    """A pause for :func:`polling.wait_until` that lets Playwright deliver the page's events meanwhile."""
    return lambda seconds: page.wait_for_timeout(seconds * 1000)


def fill(page: Any, selector: str, text: str) -> None:
    """Put ``text`` in the box at once (a paste: one change) and leave it."""
    box = page.locator(selector).locator("input[type=number], textarea, input[type=text]").first
    box.fill(text)
    box.press("Tab")


def test_a_late_note_for_one_box_never_covers_the_note_of_a_box_typed_after_it(page, monkeypatch):
    """Two check boxes, two events, one note (``#check-status``): each box's change runs its own queue-less event."""
    held = Held(ComparisonEvents.check_values_note, lambda check: str(check.a_alpha).strip() in ("3", "3.0"))
    monkeypatch.setattr(ComparisonEvents, "check_values_note", staticmethod(held))
    open_tab(page, "Equivalence")
    note = page.locator("#check-status")
    fill(page, "#b-scale", "-101")
    expect(note).to_contain_text("setting B: scale")
    fill(page, "#a-alpha", "3")  # its note (B still refused) is held on the server
    fill(page, "#b-scale", "0.0625")  # B fixed: this box's note, empty, is the newest
    expect(note).not_to_contain_text("setting B")
    held.release(page)
    expect(note).not_to_contain_text("setting B", timeout=3000)  # the older answer came last and was not shown


def test_typing_a_source_then_enter_keeps_inspects_card_when_the_clear_answers_late(page, monkeypatch):
    """Typing fires the slot's queue-less "Source changed" clear, Enter the queued Inspect; one card."""
    held = Held(panel.cleared_panel, lambda ui, message: "Source changed" in message)
    monkeypatch.setattr(panel, "cleared_panel", held)
    source = page.locator("#slot1-source textarea")
    source.click()
    source.press_sequentially(str(TINY_DEMO_DIR / TURBO))  # the first key's clear is held; the rest are typed on
    source.press("Enter")
    card = page.locator("#slot1-inspect-card")
    expect(card.locator("[data-testid=inspect-summary]")).to_be_visible()  # Inspect answered first
    held.release(page)
    expect(card).not_to_contain_text("Source changed", timeout=3000)  # the clear sent before Enter came last
    inspected(page, TURBO)


def test_a_clear_sent_before_inspect_but_read_after_it_does_not_cover_inspects_card(page):
    """The order the page sent, not the order the server read: the "Source changed" clear of a pasted 5,000-character
    source is held in the network (Playwright's router) until Inspect, sent after it by Enter, has answered; then it
    reaches the server. Numbered on arrival it was the newest and covered the card (seen on a loaded CI machine);
    numbered by the page (``change_events.SENT_JS``) it is older, and the card stays."""
    long_source = "x" * 5000
    held: list[Any] = []

    def hold_the_clear(route: Any) -> None:
        if not held and long_source in (route.request.post_data or ""):
            held.append(route)  # continued below, after Inspect's answer
        else:
            route.continue_()

    page.route("**/gradio_api/run/**", hold_the_clear)
    source = page.locator("#slot1-source textarea")
    source.fill(long_source)
    source.press("Enter")
    refusal = page.locator("#slot1-inspect-card [data-testid=refusal]")
    expect(refusal).to_contain_text("5,000 characters", timeout=60_000)  # Inspect answered; the clear is held
    wait_until(lambda: held, "the clear to be sent", 30, wait=playwright_wait(page))
    with page.expect_response(lambda response: response.request.post_data == held[0].request.post_data,
                              timeout=30_000):
        held[0].continue_()  # the clear reaches the server now, after Inspect
    page.unroute("**/gradio_api/run/**")
    answered(page)
    expect(refusal).to_contain_text("5,000 characters", timeout=3000)
    expect(page.locator("#slot1-inspect-card")).not_to_contain_text("Source changed")


def test_a_late_redraw_never_clears_the_refusal_of_a_click_sent_after_it(page, monkeypatch):
    """A change of any input clears a job's refusal from the status line; a click refused at once writes it again."""
    held = Held(AdapterEvents.readout, lambda events, info, slot: str(slot.strength).strip() == "-2.5")
    monkeypatch.setattr(AdapterEvents, "readout", lambda events, info, slot: held(events, info, slot))  # a method
    refusals: list[Any] = []  # the click's refusal: the one queue-less event a refused click sends
    page.on("requestfinished", lambda request: refusals.append(request) if "/gradio_api/run/" in request.url else None)
    pick_demo(page, TURBO)
    status = page.locator("#generate-status")
    fill(page, "#slot1-scale", "-3")
    page.locator("#generate").click()
    expect(status).to_have_text("✖ Not run: the line above says why.")
    fill(page, "#slot1-scale", "-2.5")  # still refused; the scale's redraw, which clears that line, is held
    wait_until(held.started.is_set, "the scale's redraw to reach the server", 60, wait=playwright_wait(page))
    refusals.clear()
    page.locator("#generate").click()  # refused again: its line is written after the held redraw was sent
    wait_until(lambda: refusals, "the refused click's status line to be answered", 60, wait=playwright_wait(page))
    held.release(page)
    expect(status).to_have_text("✖ Not run: the line above says why.", timeout=3000)
