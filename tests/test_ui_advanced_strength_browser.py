"""The "Advanced strength" section of adapter slot 1 in Debian's chromium (the session's app and
browser, tests/browser_fixtures.py): a person sets audio 0, a schedule and a block range; the note and the schedule's plot
follow as they type, the line above Generate names the values, and the run they start carries them (the result's
settings JSON, its copy-as-CLI line). A bad value is one line in the note, kept as typed, and Generate refuses it."""

from __future__ import annotations

import re

import pytest
from browser_fixtures import GENERATION_TIMEOUT_MS, answered, pick_demo, set_number, type_into
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DEMO = "lightx2v_turbo_no_alpha.safetensors"


def set_slider(page, selector: str, value: str) -> None:
    """Type into a slider's number box (what a person does for an exact value), then leave it."""
    box = page.locator(f"{selector} input[type=number]")
    box.fill(value)
    box.press("Tab")


def open_advanced(page) -> None:
    """Open slot 1's "Advanced strength" and wait until its controls are on the page and have sent their first
    values: Gradio draws an accordion's contents when it first opens, and a value typed into a control that is
    still being drawn is lost (no change reaches the app; seen on a fast machine)."""
    page.locator("#advanced-1").get_by_text("Advanced strength").click()
    expect(page.locator("#advanced-note-1")).to_contain_text("All factors 1")
    answered(page)


def settings_text(page) -> str:
    """The result's settings JSON as Gradio's JSON component shows it (every node is in the page, collapsed or
    not), without white space: ``"audio_strength":0,...``."""
    holder = page.locator("#settings-json .json-holder")
    expect(holder).to_contain_text("adapters")
    return re.sub(r"\s+", "", holder.text_content())


def test_the_advanced_section_reaches_the_run(page):
    pick_demo(page, DEMO)
    set_number(page, "#steps", "3")  # 2 evaluations
    open_advanced(page)
    note = page.locator("#advanced-note-1")

    set_slider(page, "#audio-strength-1", "0")
    expect(note).to_contain_text("the adapter changes nothing audio rows compute themselves")
    type_into(page, "#strength-schedule-1", "1,0.5,0.25")  # 3 values for 2 evaluations: refused where they look
    expect(page.locator("#schedule-plot-1")).to_contain_text("3 values but this run has 2 evaluations")
    type_into(page, "#strength-schedule-1", "LINEAR:1:0.5")
    plot = page.locator("#schedule-plot-1 svg")
    expect(plot).to_have_attribute("aria-label", "strength factor over 2 evaluations: 1, 0.5")
    expect(plot.locator("circle")).to_have_count(2)
    type_into(page, "#block-strength-1", "0:0.5")
    expect(note).to_contain_text("schedule linear:1:0.5")
    expect(note).to_contain_text("blocks 0:0.5")
    expect(page.locator("#apply-note")).to_contain_text("audio ×0, schedule linear:1:0.5, blocks 0:0.5")

    page.locator("#generate").click()
    expect(page.locator("#result")).to_contain_text("seed 7", timeout=GENERATION_TIMEOUT_MS)
    page.get_by_text("Reproduce: settings JSON").click()
    command = page.locator("#h3app-command")
    expect(command).to_contain_text(re.compile(r"--audio-strength 0 .*--strength-schedule linear:1:0\.5 "
                                               r".*--block-strength 0:0\.5"))
    ran = settings_text(page)  # what the run used (the backend's settings of the job), not the form
    for key, value in (("video_strength", "1"), ("text_strength", "1"), ("audio_strength", "0"),
                       ("strength_schedule", '"linear:1:0.5"'), ("block_strength", '"0:0.5"'), ("evaluations", "2")):
        assert re.search(f'"{key}":{re.escape(value)}(?![\\d.])', ran), (key, ran[:2000])


def test_a_bad_value_is_one_line_and_generate_refuses_it(page):
    pick_demo(page, DEMO)
    open_advanced(page)
    set_slider(page, "#audio-strength-1", "3")  # past the slider's end: refused in the note, never clamped
    expect(page.locator("#advanced-note-1")).to_contain_text("⚠ audio strength 3 is outside the strength sliders'")
    assert page.locator("#audio-strength-1 input[type=number]").input_value() == "3"
    set_slider(page, "#audio-strength-1", "0.5")
    expect(page.locator("#advanced-note-1")).to_contain_text("audio ×0.5")
    type_into(page, "#block-strength-1", "0-9:0.5,5-6:1")
    expect(page.locator("#advanced-note-1")).to_contain_text("⚠ block strength: block 5 is in two ranges")
    # said once, in the section's note; the line above Generate and a click's status point there
    expect(page.locator("#apply-note")).to_contain_text("an Advanced strength value is refused (the note there")
    page.locator("#generate").click()
    expect(page.locator("#generate-status")).to_have_text("✖ Not run: the line above says why.")
    expect(page.get_by_text("block 5 is in two ranges")).to_have_count(1)
    expect(page.locator("#result")).not_to_contain_text("seed 7")  # nothing ran
