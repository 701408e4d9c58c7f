"""One real browser run through the main flow, in Debian's chromium (no Playwright browser download):
pick a demo adapter → Inspect shows its format and alpha → change alpha → Load → Generate → the Equivalence
tab says identical. Saves docs/screenshot.png (the main view) and screenshots under the test's tmp folder.

Gradio keeps a heartbeat stream open for apps with session state, so the page never reaches Playwright's
"networkidle"; the test waits for "load" and then for the app's own elements (auto-waiting locators).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from app_fixtures import running_app

from h3app.backend.service import Backend

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]
DOCS_SCREENSHOT = Path(__file__).resolve().parents[1] / "docs" / "screenshot.png"
DEMO = "lightx2v_turbo_no_alpha.safetensors"
GENERATION_TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def app_url(tiny_model, tmp_path_factory):
    backend = Backend(loaded=tiny_model, output_dir=tmp_path_factory.mktemp("outputs"))
    try:
        with running_app(backend) as url:
            yield url
    finally:
        backend.binder.reset()  # the model is shared with the rest of the session: leave it at its base
        backend.close()


def test_whole_flow_in_chromium(app_url, tmp_path):
    from playwright import sync_api  # pinned in requirements-dev.txt: a missing or broken install fails

    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is required: apt-get install chromium (scripts/test.sh does it)"
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(app_url)
            page.wait_for_load_state("load")
            expect = sync_api.expect
            expect.set_options(timeout=60_000)  # a loaded 2-core machine: generous waits, auto-retrying
            expect(page.locator("#generate")).to_be_visible()

            # pick a demo adapter, then Inspect: format and alpha (a guess: none stored) from the header
            page.locator("#slot1-demo input").click()
            page.get_by_role("option", name=DEMO).click()
            expect(page.locator("#slot1-source textarea")).to_have_value(re.compile(re.escape(DEMO) + "$"))
            page.locator("#slot1-inspect").click()
            card = page.locator("#slot1-inspect-card")
            expect(card).to_contain_text("format peft")
            expect(card).to_contain_text("24 targets")
            expect(page.locator("#slot1-alpha-card")).to_contain_text("alpha 128 — a guess")
            expect(page.locator("#slot1-readout [data-testid=effective-scale]")).to_have_text("1")

            # change alpha: typing a value ticks Override; the effective scale follows at once (no model call)
            alpha = page.locator("#slot1-alpha").locator("input, textarea")
            alpha.click()
            alpha.press("Control+a")
            alpha.press_sequentially("8", delay=50)  # typed like a person (Gradio's .input fires on keystrokes)
            alpha.press("Tab")
            expect(page.locator("#slot1-override input")).to_be_checked()
            expect(page.locator("#slot1-readout [data-testid=effective-scale]")).to_have_text("0.0625")
            expect(page.locator("#slot1-alpha-card")).to_contain_text("your override")

            # Load: the match report and the strength profile
            page.locator("#slot1-load").click()
            expect(page.locator("#slot1-report")).to_contain_text("Loaded: all 24 targets bound",
                                                                  timeout=GENERATION_TIMEOUT_MS)
            expect(page.locator("#slot1-profile-note")).to_contain_text("median relative update")

            # Generate (3 steps → 2 evaluations)
            steps = page.locator("#steps input[type=number]")
            steps.fill("3")
            steps.press("Tab")
            page.locator("#generate").click()
            result = page.locator("#result")
            expect(result).to_contain_text("seed 7", timeout=GENERATION_TIMEOUT_MS)
            expect(result).to_contain_text("alpha 8 (your override)")
            expect(page.locator("#video video")).to_have_count(1)
            main_view = tmp_path / "main_view.png"
            page.screenshot(path=str(main_view), full_page=True)

            # Equivalence: A (8 × 1.0) and B (128 × 0.0625) identical bit for bit
            page.get_by_role("tab", name="Equivalence check").click()
            page.locator("#check").click()
            expect(page.locator("#verdict [data-testid=verdict]")).to_contain_text(
                "IDENTICAL", timeout=3 * GENERATION_TIMEOUT_MS)
            expect(page.locator("#verdict")).to_contain_text("control: A run twice gave the same hash")
            page.screenshot(path=str(tmp_path / "equivalence.png"), full_page=True)
        finally:
            browser.close()
    assert main_view.stat().st_size > 50_000
    DOCS_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(main_view, DOCS_SCREENSHOT)
