"""The comparison view in Debian's chromium, read as a person sees it: the equivalence defaults follow the adapter,
"Play all" plays every video in step, the grid has its headers and the no-LoRA baseline, a click on two cells
compares them, History labels and differences read as words — at 1400 px and at 400 px wide.

Shots of these runs go to the folder named by H3APP_SCREENSHOT_DIR when set (docs/ui.md); a test run never changes
the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from browser_fixtures import open_app, open_tab, pick_demo, shoot
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TURBO = "tiny_turbo_4step.safetensors"
JOB_TIMEOUT_MS = 360_000
SYNC_SECONDS = 0.1


def pick_turbo_at_two_steps(page) -> None:
    """The Turbo demo in slot 1, and 2 steps (one evaluation: the quickest run)."""
    pick_demo(page, TURBO)
    page.locator("#steps input[type=number]").fill("2")
    page.locator("#steps input[type=number]").press("Enter")


def number_value(page, selector: str) -> float:
    return float(page.locator(f"{selector} input[type=number]").input_value())


def video_times(page, view: str) -> list[float]:
    """currentTime of every video of ``view`` a person can see (display not none, on the page)."""
    return page.evaluate("""(view) => Array.from(document.querySelectorAll(`${view} video`))
        .filter((v) => v.offsetParent !== null && v.getBoundingClientRect().width > 0)
        .map((v) => v.currentTime)""", view)


def assert_plays_in_step(page, view: str, count: int) -> None:
    pause = page.locator(view).get_by_role("button", name="Pause all")
    if pause.count():
        pause.click()
    page.locator(view).get_by_role("button", name="Play all").click()
    expect(page.locator(view).get_by_role("button", name="Pause all")).to_be_visible()
    page.wait_for_timeout(300)
    first = video_times(page, view)
    assert len(first) == count, first
    assert max(first) - min(first) <= SYNC_SECONDS, first
    page.wait_for_timeout(400)
    later = video_times(page, view)
    assert max(later) - min(later) <= SYNC_SECONDS, later
    assert later != first, (first, later)  # advancing (or looped round: still moving)


def run_check(page) -> None:
    open_tab(page, "Equivalence")
    page.locator("#check").click()
    expect(page.locator("#verdict [data-testid=verdict]")).to_contain_text("IDENTICAL", timeout=JOB_TIMEOUT_MS)


def check_flow(page, tmp_path: Path, suffix: str) -> None:
    pick_turbo_at_two_steps(page)
    open_tab(page, "Equivalence")
    # the defaults come from the adapter: trained at alpha 1, rank 16
    expect(page.locator("#check-pair-note")).to_contain_text("alpha 1 × scale 1")
    assert [number_value(page, s) for s in ("#a-alpha", "#a-scale", "#b-alpha", "#b-scale")] == [1, 1, 16, 0.0625]
    expect(page.locator("#check-pair-note")).to_contain_text("16× as strong as A")
    run_check(page)
    view = page.locator("#check-view")
    for label in ("A: alpha 1 × scale 1", "B: alpha 16 × scale 0.0625", "fallback: alpha = rank × scale 1"):
        expect(view.get_by_text(label)).to_be_visible()
    expect(view.locator("audio")).to_have_count(3)  # every column's soundtrack has a player
    assert page.evaluate("getComputedStyle(document.querySelector('#check-view video')).imageRendering") \
        == "pixelated"
    assert_plays_in_step(page, "#check-view", 3)
    view.get_by_label("listen to").select_option("B")
    assert page.evaluate("""Array.from(document.querySelectorAll('#check-view video'))
        .map((v) => v.muted)""") == [True, False, True]
    shoot(page, f"compare-equivalence{suffix}.png", tmp_path, "#check-view")


def test_equivalence_defaults_and_play_all_in_step(browser, app, tmp_path):
    page = open_app(browser, app[0], 1400)
    try:
        check_flow(page, tmp_path, "")
        view = page.locator("#check-view")
        width = view.locator("video").first.bounding_box()["width"]
        assert width >= 250, width  # large players, not 220 px thumbnails
        # A|B wipe: the pair stacked, B clipped at the line; blink alternates them
        view.get_by_label("view").select_option("wipe")
        expect(view.get_by_text("left of the line: A · right: B")).to_be_visible()
        assert_plays_in_step(page, "#check-view", 2)
        shoot(page, "compare-wipe.png", tmp_path, "#check-view")
        # blink: the pair alternates in one place
        view.get_by_label("view").select_option("blink")
        showing = view.locator(".h3cv-showing")
        expect(showing).to_have_text(re.compile(r"^showing (A|B)$"))
        first = showing.inner_text()
        expect(showing).not_to_have_text(first, timeout=3000)
        view.get_by_label("view").select_option("side")
        # frame step: pauses and moves every video by one frame (24 fps)
        view.get_by_role("button", name="Pause all").click()
        before = video_times(page, "#check-view")
        view.get_by_role("button", name="next frame").click()
        page.wait_for_timeout(300)
        after = video_times(page, "#check-view")
        assert max(after) - min(after) <= SYNC_SECONDS and abs(after[0] - before[0] - 1 / 24) < 1 / 24 + 1e-3
    finally:
        page.close()


def test_grid_headers_baseline_marks_and_two_clicks(browser, app, tmp_path):
    page = open_app(browser, app[0], 1400)
    try:
        pick_turbo_at_two_steps(page)
        open_tab(page, "Grid")
        page.locator("#grid-run").click()
        expect(page.locator("#grid-status")).to_contain_text("Done: 4 cells", timeout=JOB_TIMEOUT_MS)
        grid = page.locator("#grid-view table.h3cv-cells")
        for header in ("alpha ╲ scale", "× 0.0625", "× 1"):
            expect(grid.locator("thead").get_by_text(header, exact=True)).to_be_visible()
        for header in ("no LoRA", "α 1", "α 16"):
            expect(grid.locator("tbody th").get_by_text(header, exact=True)).to_be_visible()
        expect(grid.locator("img")).to_have_count(5)  # the baseline is a cell of its own
        # α16 × 0.0625 is α1 × 1 bit for bit, and says so
        expect(grid.get_by_role("button", name=re.compile(r"α 16 × 0\.0625"))).to_contain_text("= α1×1")
        caption = grid.locator(".h3cv-cell-caption").nth(1)
        assert caption.evaluate("(e) => e.scrollWidth <= e.clientWidth + 1")  # not cut
        # the hash column of the per-cell table is on screen without scrolling sideways
        table = page.locator("#grid-table")
        hash_cell = table.get_by_text(re.compile(r"^[0-9a-f]{12}$")).first
        assert hash_cell.bounding_box()["x"] + hash_cell.bounding_box()["width"] \
            <= table.bounding_box()["x"] + table.bounding_box()["width"] + 1
        # two clicks: the two cells in the view, A and B
        grid.get_by_role("button", name=re.compile(r"α 1 × 1")).click()
        grid.get_by_role("button", name=re.compile(r"α 16 × 1")).click()
        view = page.locator("#grid-view .h3cv-players")
        expect(view.locator("figcaption")).to_have_text(["α 1 × 1", "α 16 × 1"])
        assert_plays_in_step(page, "#grid-view", 2)
        shoot(page, "compare-grid.png", tmp_path, "#grid-view")
    finally:
        page.close()


def choose(page, selector: str, text: str) -> None:
    """Pick the dropdown entry whose label contains ``text`` (typed into the box as a filter, then Enter)."""
    box = page.locator(f"{selector} input")
    box.click()
    box.fill(text)
    page.locator(f"{selector} [role=option]").filter(has_text=text).first.click()
    expect(box).to_have_value(re.compile(re.escape(text)))


def test_history_labels_and_differences_in_words(browser, app, tmp_path):
    page = open_app(browser, app[0], 1400)
    try:
        pick_turbo_at_two_steps(page)
        run_check(page)
        open_tab(page, "History")
        table = page.locator("#history-table")
        expect(table).to_contain_text(re.compile(r"check fallback · “a red ball[^”]*” · seed 7 · tiny_turbo_4step "
                                                 r"α 16 \(rank fallback\) × 1"))
        expect(table).to_contain_text("seed 7 · tiny_turbo_4step α 16 (typed) × 0.0625")
        choose(page, "#history-a", "check fallback")
        choose(page, "#history-b", "check A")
        page.locator("#history-compare").click()
        differences = page.locator("#history-differences")
        expect(differences).to_contain_text("16 (rank fallback) → 1 (typed)")
        expect(differences).not_to_contain_text(re.compile(r"resolved_alpha|\{'|None"))
        view = page.locator("#history-view")
        expect(view.locator("figcaption").first).to_contain_text("A: check fallback · “")
        assert_plays_in_step(page, "#history-view", 2)
        shoot(page, "compare-history.png", tmp_path)
    finally:
        page.close()


def test_the_same_flow_at_400_px(browser, app, tmp_path):
    page = open_app(browser, app[0], 400)
    try:
        check_flow(page, tmp_path, "-phone")
        box = page.locator("#check-view video").first.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 400 + 1  # no sideways scroll
        assert page.evaluate("document.documentElement.scrollWidth") <= 400 + 1
    finally:
        page.close()
