"""A typed source's Inspect answer is not wiped by the "source changed" event of the same text
(h3app/ui/adapter/panel.py, ``InspectedTexts``): typing fires a queue-less forget and Enter a queued Inspect at
almost the same moment, and on a loaded server Inspect's answer can reach the page first."""

from __future__ import annotations

from types import SimpleNamespace

from h3app.ui.adapter.panel import InspectedTexts


def page(name: str | None) -> SimpleNamespace:
    return SimpleNamespace(session_hash=name)


def test_forget_keeps_an_answer_for_the_text_this_page_asked_about_and_no_other():
    inspected = InspectedTexts()
    inspected.asked(page("a"), "  owner/repo ")
    assert inspected.answered(page("a"), "owner/repo")  # the same text (spaces as the parser strips them)
    assert not inspected.answered(page("a"), "owner/repo2")  # typed on: forget clears as before
    assert not inspected.answered(page("b"), "owner/repo")  # another page asked nothing
    inspected.asked(page("a"), "owner/repo2")
    assert not inspected.answered(page("a"), "owner/repo")  # only the last text a page asked about counts


def test_pages_without_a_session_are_never_matched_and_old_pages_are_forgotten():
    inspected = InspectedTexts(limit=2)
    inspected.asked(None, "x")
    inspected.asked(page(None), "x")
    assert not inspected.answered(None, "x") and not inspected.answered(page(None), "x")
    for name in ("p1", "p2", "p3"):
        inspected.asked(page(name), "x")
    assert inspected.texts.keys() == ["p2", "p3"]  # bounded: the oldest page went first
    assert not inspected.answered(page("p1"), "x") and inspected.answered(page("p3"), "x")
