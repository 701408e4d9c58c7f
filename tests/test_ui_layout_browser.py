"""The page's first five minutes as a person reads them, in Debian's chromium at 1280 and at 400 px (docs/ui.md,
"Phone width"): the sections in their numbered order, nothing past its card or the screen, option names and slider
values whole, the schedule plot's every point inside its panel, and a first Generate at defaults whose prompt is one
the tiny model was trained on."""

from __future__ import annotations

import pytest
from browser_fixtures import GENERATION_TIMEOUT_MS, answered, open_app, pick_demo
from playwright.sync_api import expect
from test_ui_advanced_strength_browser import open_advanced
from test_ui_truth_browser import CUT_OFF_JS

from h3app.model.tiny_training.scenes import all_prompts

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WHOLE_JS = """(selector) => { const box = document.querySelector(selector);
    return box ? [box.value, box.scrollWidth <= box.clientWidth + 1] : null; }"""
# each card no wider than the column that holds it (its table scrolls inside it)
CARDS_JS = """() => Array.from(document.querySelectorAll('.h3-card')).filter((c) => c.offsetParent !== null)
    .filter((c) => c.getBoundingClientRect().right > c.closest('.column').getBoundingClientRect().right + 1)
    .map((c) => c.dataset.testid || c.className)"""
# the schedule plot's points, each inside the panel that shows it
POINTS_JS = """(selector) => { const panel = document.querySelector(selector).getBoundingClientRect();
    return Array.from(document.querySelectorAll(`${selector} circle`)).map((c) => c.getBoundingClientRect())
        .map((b) => b.left >= panel.left - 1 && b.right <= panel.right + 1); }"""


def section_tops(page) -> list[float]:
    return [page.get_by_text(name, exact=True).bounding_box()["y"]
            for name in ("1 · Adapter", "2 · Request", "3 · Run and compare")]


@pytest.mark.parametrize("width", [1280, 400])
def test_the_first_five_minutes_read_in_order_whole_and_inside_their_cards(browser, app, width):
    page = open_app(browser, app[0], width=width, height=900)
    try:
        tops = section_tops(page)
        if width < 720:  # one column: the numbered order, top to bottom
            assert tops == sorted(tops), tops
        prompt = page.locator("#prompt textarea").input_value()
        assert prompt in {words.text for words in all_prompts()}, prompt  # a sentence the tiny model knows
        expect(page.locator("#prompt-knows")).to_contain_text("a {red|yellow|green|blue} ball")
        pick_demo(page, "tiny_turbo_4step.safetensors")
        assert page.evaluate(WHOLE_JS, "#slot1-demo input") == ["tiny_turbo_4step.safetensors", True]
        weight = page.evaluate(WHOLE_JS, "#slot1-weight input")
        assert weight[0].startswith("tiny_turbo_4step.safetensors") and weight[1], weight
        duration = page.locator("#duration input[type=number]")
        duration.fill("14.375")
        duration.press("Tab")
        answered(page)
        assert page.evaluate(WHOLE_JS, "#duration input[type=number]") == ["14.375", True]
        duration.fill("5")
        duration.press("Tab")
        open_advanced(page)
        schedule = page.locator("#strength-schedule-1 textarea")
        schedule.fill("1,1,0.5,0.5")
        schedule.press("Tab")
        expect(page.locator("#schedule-plot-1 circle")).to_have_count(4)
        assert page.evaluate(POINTS_JS, "#schedule-plot-1") == [True] * 4
        answered(page)
        assert page.evaluate(CARDS_JS) == []
        assert page.evaluate(CUT_OFF_JS) == []
        schedule.fill("")
        schedule.press("Tab")
        page.locator("#generate").click()
        expect(page.locator("#video video")).to_be_visible(timeout=GENERATION_TIMEOUT_MS)
        expect(page.locator("#result")).to_contain_text("seed 7")
        assert page.evaluate(CARDS_JS) == []
        assert page.evaluate(CUT_OFF_JS) == []
    finally:
        page.close()
