"""Step previews in Debian's chromium (issue 36): Generate's preview beside "step k of n"; the equivalence check's A,
B and fallback previews side by side, step by step; Cancel keeps the last previews with "stopped after k of n"."""

from __future__ import annotations

import re

import pytest
from browser_fixtures import held_steps, open_app, open_tab, pick_demo, record_text, seen_text, shoot
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]

JOB_TIMEOUT_MS = 360_000
COLUMNS = ("#check-preview-a", "#check-preview-b", "#check-preview-fallback")


def set_steps(page, steps: int) -> None:
    page.locator("#steps input[type=number]").fill(str(steps))
    page.locator("#steps input[type=number]").press("Enter")


def shown_images(page, selectors) -> list[str]:
    """The src of the image each of ``selectors`` shows ("" where none is visible)."""
    return [page.evaluate("""(s) => { const img = document.querySelector(`${s} img`);
        return img && img.offsetParent !== null && img.naturalWidth > 0 ? img.src : ""; }""", s) for s in selectors]


def test_generate_shows_each_step_beside_its_progress_text(browser, app, tmp_path):
    page = open_app(browser, app[0], 1400)
    try:
        set_steps(page, 5)
        record_text(page, "#generate-preview-note")
        page.locator("#generate").click()
        expect(page.locator("#generate-preview-note")).to_contain_text("Step 4 of 4", timeout=JOB_TIMEOUT_MS)
        expect(page.locator("#video video")).to_be_visible(timeout=JOB_TIMEOUT_MS)
        seen = seen_text(page, "#generate-preview-note")
        assert "Step 1 of 4" in seen and "Step 2 of 4" in seen, seen  # it updated while the run denoised
        assert shown_images(page, ["#generate-preview"])[0]
        shoot(page, "preview-generate.png", tmp_path, "#generate-preview-box")
    finally:
        page.close()


def test_the_check_previews_a_b_and_fallback_side_by_side_and_cancel_keeps_them(browser, app, tmp_path):
    page = open_app(browser, app[0], 1400)
    try:
        pick_demo(page, "tiny_turbo_4step.safetensors")
        set_steps(page, 4)
        open_tab(page, "Equivalence")
        record_text(page, "#check-preview-note")
        page.locator("#check").click()
        expect(page.locator("#verdict [data-testid=verdict]")).to_contain_text("IDENTICAL", timeout=JOB_TIMEOUT_MS)
        seen = seen_text(page, "#check-preview-note")
        # the fallback runs first, then A (shown beside the fallback at A's step), then B beside both. The page shows
        # the newest step whenever it asks, so on a fast machine a run can pass a step between two answers: the
        # fallback's and A's first steps are asserted (the stream starts with them), B's only at some step.
        assert "fallback (alpha = rank) at step 1 of 3" in seen, seen
        assert "A · fallback (alpha = rank) at step 1 of 3 (B not started)" in seen, seen
        assert re.search(r"A · B · fallback \(alpha = rank\) at step \d of 3", seen), seen
        assert seen.index("(A, B not started)") < seen.index("(B not started)") < seen.index("A · B ·"), seen
        boxes = [page.locator(s).bounding_box() for s in COLUMNS]
        assert boxes[0]["x"] < boxes[1]["x"] < boxes[2]["x"] and len({round(b["y"]) for b in boxes}) == 1
        assert all(shown_images(page, COLUMNS))
        shoot(page, "preview-check.png", tmp_path, "#check-previews")

        set_steps(page, 30)  # long enough to cancel mid-run, with each step held however fast the machine
        open_tab(page, "Equivalence")
        with held_steps(app[1]):
            page.locator("#check").click()
            expect(page.locator("#check-preview-note")).to_contain_text(re.compile(r"at step [2-9] of \d\d"),
                                                                        timeout=JOB_TIMEOUT_MS)
            page.locator("#check-cancel").click()
            # one count: each run's own steps, in the status line (the preview note points there)
            expect(page.locator("#check-status")).to_contain_text(re.compile(r"Cancelled.*after \d+ of \d\d steps"),
                                                                  timeout=JOB_TIMEOUT_MS)
        expect(page.locator("#check-preview-note")).to_contain_text("Stopped")
        expect(page.locator("#check-status")).not_to_contain_text(re.compile(r"of \d{3} steps"))
        assert shown_images(page, COLUMNS[2:])[0]  # the fallback, the column that ran, stays on screen
        shoot(page, "preview-check-stopped.png", tmp_path)
    finally:
        page.close()
