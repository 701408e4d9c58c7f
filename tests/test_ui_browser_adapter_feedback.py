"""What the adapter panel tells a person, in Debian's chromium, read as a person reads the page: the demo Turbo shows
and runs its registry alpha, refusals say so where the person looks, warnings follow the adapter's own facts,
overrides and presets, Enter after a demo pick, the labels. The session's app and browser
(tests/browser_fixtures.py); tests/test_ui_adapter_feedback.py checks the same through the event functions."""

from __future__ import annotations

import re

import pytest
from browser_fixtures import GENERATION_TIMEOUT_MS, error_badges, pick_demo, set_number, type_into
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TURBO = "tiny_turbo_4step.safetensors"
NO_ALPHA = "lightx2v_turbo_no_alpha.safetensors"


def no_pop_up_and_no_error_left(page) -> None:
    """The status line under the button is the one place a refused click is said: no pop-up repeats it (the page
    shows a toast as it reads the failed answer, before the status line is written) and nothing reads "Error"."""
    expect(page.locator("[data-testid=toast-body]")).to_have_count(0)
    assert error_badges(page) == 0


def scale_shown(page):
    return page.locator("#slot1-readout [data-testid=effective-scale]")


def test_the_demo_turbo_shows_and_runs_alpha_1_from_the_registry(page):
    pick_demo(page, TURBO)
    expect(page.locator("#slot1-alpha-card")).to_contain_text("alpha 1")
    expect(page.locator("#slot1-alpha-card")).to_contain_text("the known-adapter registry")
    expect(scale_shown(page)).to_have_text("0.0625")
    page.locator("#slot1-load").click()
    expect(page.locator("#slot1-report")).to_contain_text("Loaded", timeout=GENERATION_TIMEOUT_MS)
    expect(page.locator("#slot1-alpha-card")).to_contain_text("the known-adapter registry")
    for shown in ("#slot1-alpha-card", "#slot1-report"):  # no "no alpha in the registry", no "2× too strong"
        expect(page.locator(shown)).not_to_contain_text(re.compile("too strong|no alpha"))
    set_number(page, "#steps", "2")
    page.locator("#generate").click()
    result = page.locator("#result")
    expect(result).to_contain_text("alpha 1 (registry) × scale 1 → effective 0.0625",
                                   timeout=GENERATION_TIMEOUT_MS)


def test_a_refused_alpha_says_so_where_the_person_looks(page):
    pick_demo(page, TURBO)
    type_into(page, "#slot1-alpha", "eight")
    expect(page.locator("#slot1-alpha-card")).to_contain_text("not applied")
    page.locator("#generate").click()
    expect(page.locator("#generate-status")).to_have_text("✖ Not run: the line above says why.")
    expect(page.locator("#apply-note")).to_contain_text("its alpha or scale is refused (the alpha card says why)")
    expect(page.get_by_text(re.compile("alpha must be"))).to_have_count(1)  # the card's line, once
    no_pop_up_and_no_error_left(page)
    type_into(page, "#slot1-alpha", "8")  # fixed: the status line's refusal goes
    expect(page.locator("#generate-status")).to_have_text("")


def test_a_scale_far_from_the_files_alpha_is_flagged(page):
    pick_demo(page, TURBO)
    type_into(page, "#slot1-alpha", "128")
    set_number(page, "#slot1-scale", "2.56")
    expect(scale_shown(page)).to_have_text("20.48")
    expect(page.locator("#slot1-readout [data-testid=scale-warning]")).to_contain_text("328×")


def test_switching_drops_the_override_and_the_preset_applies_its_alpha(page):
    pick_demo(page, TURBO)
    type_into(page, "#slot1-alpha", "16")
    expect(page.locator("#slot1-override input")).to_be_checked()
    page.locator("#slot1-preset").click()
    expect(page.locator("#slot1-override input")).not_to_be_checked()
    expect(scale_shown(page)).to_have_text("0.0625")
    type_into(page, "#slot1-alpha", "16")
    pick_demo(page, NO_ALPHA)
    expect(page.locator("#slot1-override input")).not_to_be_checked()
    expect(page.locator("#slot1-alpha-card")).to_contain_text("was for tiny_turbo_4step.safetensors: dropped")
    expect(scale_shown(page)).to_have_text("1")


def test_a_refused_source_clears_the_weight_box_and_the_note(page):
    pick_demo(page, TURBO)
    type_into(page, "#slot1-source", "not/a/repo!!")
    page.locator("#slot1-inspect").click()
    expect(page.locator("#slot1-inspect-card")).to_contain_text("neither an existing local path nor a Hub repo id")
    expect(page.locator("#slot1-inspect-card")).not_to_contain_text("local path not/a/repo")
    expect(page.locator("#apply-note")).to_contain_text("adapter 1 is not applied: its source is refused")
    expect(page.locator("#slot1-weight")).not_to_contain_text(TURBO)
    page.locator("#generate").click()
    expect(page.locator("#generate-status")).to_contain_text("Not run")
    no_pop_up_and_no_error_left(page)


def test_enter_right_after_a_demo_pick_keeps_its_card(page):
    for _ in range(3):
        pick_demo(page, TURBO)
        page.locator("#slot1-source textarea").press("Enter")
        page.wait_for_timeout(1500)
        expect(page.locator("#slot1-inspect-card")).to_contain_text("format peft")
        expect(page.locator("#slot1-inspect-card")).not_to_contain_text("Source changed")


def test_a_scale_below_the_slider_is_refused_with_a_word(page):
    pick_demo(page, TURBO)
    set_number(page, "#slot1-scale", "-5")
    expect(page.locator("#slot1-alpha-card")).to_contain_text("scale -5 is outside the Scale slider")
    expect(page.get_by_text(re.compile("scale -5 is outside"))).to_have_count(1)  # once: the readout points there


def test_labels_say_alpha_per_module_once_and_the_longest_duration(page):
    pick_demo(page, "peft_diffusers_metadata.safetensors")
    card = page.locator("#slot1-alpha-card")
    expect(card).to_contain_text("alpha per module")
    expect(card).not_to_contain_text("from 2 from")
    expect(page.locator("#duration")).to_contain_text("14.375")
