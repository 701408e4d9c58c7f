"""Real browser runs in Debian's chromium, on the session's one app and one browser (tests/browser_fixtures.py): the
main flow (demo adapter → Inspect → alpha → Load → Generate → Equivalence says identical; its shots are copied to
the folder named by H3APP_SCREENSHOT_DIR when set; a test run never changes the repository), then one test per
finding of a person using the app (what they see: visible text, bar heights, element positions).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest
from browser_fixtures import (
    GENERATION_TIMEOUT_MS,
    error_badges,
    held_steps,
    open_app,
    open_tab,
    pick_demo,
    record_text,
    seen_text,
    set_number,
    type_into,
)
from playwright.sync_api import expect

from h3app.backend.equivalence import PHASES
from h3app.backend.generation import Cancelled
from h3app.ui.generate.events import EQUIVALENCE_RUNS

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DEMO = "lightx2v_turbo_no_alpha.safetensors"
# The profile's y axis ends 15 % above its tallest bar: the tallest bar fills 1/1.15 of the plot's height.
TALLEST_BAR_SHARE = 1 / 1.15


def load_demo(page) -> None:
    pick_demo(page, DEMO)
    page.locator("#slot1-load").click()
    expect(page.locator("#slot1-report")).to_contain_text("Loaded: all 24 targets bound",
                                                          timeout=GENERATION_TIMEOUT_MS)


def test_whole_flow_in_chromium(page, tmp_path):
    # pick a demo adapter (inspected at once): format and alpha (a guess: none stored) from the header
    pick_demo(page, DEMO)
    expect(page.locator("#slot1-inspect-card")).to_contain_text("24 targets")
    expect(page.locator("#slot1-alpha-card")).to_contain_text("alpha 128 — a guess")
    expect(page.locator("#slot1-readout [data-testid=effective-scale]")).to_have_text("1")

    # change alpha: typing a value ticks Override; the effective scale follows at once (no model call)
    type_into(page, "#slot1-alpha", "8")
    expect(page.locator("#slot1-override input")).to_be_checked()
    expect(page.locator("#slot1-readout [data-testid=effective-scale]")).to_have_text("0.0625")
    expect(page.locator("#slot1-alpha-card")).to_contain_text("your override")

    # Load: the match report and the strength profile
    page.locator("#slot1-load").click()
    expect(page.locator("#slot1-report")).to_contain_text("Loaded: all 24 targets bound",
                                                          timeout=GENERATION_TIMEOUT_MS)
    expect(page.locator("#slot1-profile-note")).to_contain_text("median relative update")

    # Generate (3 steps → 2 evaluations)
    set_number(page, "#steps", "3")
    page.locator("#generate").click()
    result = page.locator("#result")
    expect(result).to_contain_text("seed 7", timeout=GENERATION_TIMEOUT_MS)
    expect(result).to_contain_text("alpha 8 (typed) × scale 1 → effective 0.0625")
    expect(page.locator("#video video")).to_have_count(1)
    main_view = tmp_path / "main_view.png"
    page.screenshot(path=str(main_view), full_page=True)

    # Equivalence: A (8 × 1.0) and B (128 × 0.0625) identical bit for bit
    open_tab(page, "Equivalence")
    page.locator("#check").click()
    expect(page.locator("#verdict [data-testid=verdict]")).to_contain_text("IDENTICAL",
                                                                          timeout=3 * GENERATION_TIMEOUT_MS)
    expect(page.locator("#verdict")).to_contain_text("control: A run twice gave the same hash")
    page.screenshot(path=str(tmp_path / "equivalence.png"), full_page=True)
    assert main_view.stat().st_size > 50_000
    if os.environ.get("H3APP_SCREENSHOT_DIR"):  # for docs: the main view and the verdict from a real run
        for shot in (main_view, tmp_path / "equivalence.png"):
            shutil.copyfile(shot, Path(os.environ["H3APP_SCREENSHOT_DIR"]) / shot.name)


def test_source_box_refusals_are_one_readable_line_in_the_card(page):
    type_into(page, "#slot1-source", "not/a/repo!!")
    page.locator("#slot1-inspect").click()
    card = page.locator("#slot1-inspect-card [data-testid=refusal]")
    expect(card).to_contain_text("not/a/repo!!")
    assert error_badges(page) == 0
    type_into(page, "#slot1-source", " ")
    page.locator("#slot1-inspect").click()
    expect(card).to_contain_text("the adapter source is empty")
    assert error_badges(page) == 0
    expect(page.locator("#slot1-alpha")).to_be_visible()


def tallest_bar_share(page) -> float:
    """Height of the tallest bar of the by-group plot ÷ the plot area's height (read from the drawn SVG)."""
    return page.locator("#slot1-group-plot svg").first.evaluate("""svg => {
        const area = svg.querySelector('path.background').getBBox().height;
        const bars = [...svg.querySelectorAll('.mark-rect path')].map(p => p.getBBox().height);
        return Math.max(...bars) / area; }""")


def test_profile_bars_follow_every_alpha_and_scale_change(page):
    load_demo(page)
    for scale in ("3", "0.5", "2"):
        set_number(page, "#slot1-scale", scale)
        expect(page.locator("#slot1-profile-note")).to_contain_text(f"× scale {scale}")
        deadline = time.monotonic() + 20
        while abs(tallest_bar_share(page) - TALLEST_BAR_SHARE) > 0.05 and time.monotonic() < deadline:
            page.wait_for_timeout(250)
        assert tallest_bar_share(page) == pytest.approx(TALLEST_BAR_SHARE, abs=0.05), scale


def test_a_typed_source_is_not_replaced_by_the_demo(page):
    pick_demo(page, DEMO)
    typed = "/tmp/typed-by-hand/lora.safetensors"
    type_into(page, "#slot1-source", typed)  # Tab lands on the demo dropdown
    page.locator("#slot1-inspect").click()
    expect(page.locator("#slot1-inspect-card [data-testid=refusal]")).to_contain_text("typed-by-hand")
    expect(page.locator("#slot1-source textarea")).to_have_value(typed)


def test_advice_follows_the_settings_it_talks_about(page):
    load_demo(page)
    note = page.locator("#slot1-profile-note")
    expect(note).to_contain_text("meaningless on this model")  # a toy model: the heuristic is disarmed
    type_into(page, "#slot1-alpha", "8")
    expect(note).to_contain_text("At alpha 8 × scale 1")
    expect(page.locator("#slot1-report")).not_to_contain_text("no alpha stored")
    expect(note).not_to_contain_text("no alpha stored")


# The check's four runs in the order the backend runs them, named as its progress names them.
CHECK_RUNS = dict(enumerate((EQUIVALENCE_RUNS[run] for run in PHASES), start=1))


def test_progress_names_the_run_and_leaves_the_seed_box_alone(page):
    pick_demo(page, DEMO)
    set_number(page, "#steps", "12")
    record_text(page, "#video")  # a step's progress lasts a fraction of a second: recorded, not waited for
    record_text(page, "#seed")
    page.locator("#generate").click()
    expect(page.locator("#result")).to_contain_text("seed 7", timeout=GENERATION_TIMEOUT_MS)
    assert re.search(r"step \d+/11", seen_text(page, "#video")), seen_text(page, "#video")
    assert not re.search(r"step|processing", seen_text(page, "#seed")), seen_text(page, "#seed")
    open_tab(page, "Equivalence")
    set_number(page, "#steps", "6")
    expect(page.locator("#check-estimate")).to_contain_text(re.compile(r"costs 3 generations \+ 1 denoising step .*about [\d.]+ s"))
    record_text(page, "#verdict")
    page.locator("#check").click()
    expect(page.locator("#verdict [data-testid=verdict]")).to_contain_text("IDENTICAL",
                                                                          timeout=3 * GENERATION_TIMEOUT_MS)
    seen = seen_text(page, "#verdict")
    named = {int(n): name for n, name in re.findall(r"run (\d)/4: (.+?): step", seen)}
    assert named and all(CHECK_RUNS.get(n) == name for n, name in named.items()), seen
    assert set(named) - {1}, seen  # the progress moved on to a later run and named it


def test_labels_read_as_meant(page):
    pick_demo(page, DEMO)
    set_number(page, "#steps", "2")
    page.locator("#generate").click()
    result = page.locator("#result")
    expect(result).to_contain_text("generated in", timeout=GENERATION_TIMEOUT_MS)
    expect(result).not_to_contain_text(re.compile(r"Hz · [\d.]+ s"))
    open_tab(page, "Equivalence")
    page.locator("#check").click()
    expect(page.locator("#verdict [data-testid=verdict]")).to_be_visible(timeout=3 * GENERATION_TIMEOUT_MS)
    open_tab(page, "History")
    history = page.locator("#history-table")
    # the demo's alpha in use is the rank guess 128 = rank: B doubles alpha and halves the scale
    expect(history).to_contain_text("· seed 7 · lightx2v_turbo_no_alpha α 256 (typed) × 0.5")
    expect(history).not_to_contain_text("check A A")
    page.locator("#history-a input").click()
    page.get_by_role("option", name=re.compile(r"^#1 ")).click()  # the generation, against check B
    page.locator("#history-compare").click()
    differences = page.locator("#history-differences")
    expect(differences).to_be_visible()
    expect(differences).not_to_contain_text(re.compile(r"\{'|None|rank_fallback"))


def test_cancel_confirms_and_an_abandoned_job_stops(page, browser, app):
    url, backend = app
    with held_steps(backend):
        set_number(page, "#steps", "60")
        page.locator("#generate").click()
        expect(page.locator("#video")).to_contain_text(re.compile(r"step \d+/59"), timeout=GENERATION_TIMEOUT_MS)
        page.locator("#cancel").click()
        expect(page.locator("#generate-status")).to_contain_text(re.compile(r"Cancelled after \d+ of 59 steps"))

        other = open_app(browser, url)
        set_number(other, "#steps", "60")
        other.locator("#generate").click()
        expect(other.locator("#video")).to_contain_text(re.compile(r"step \d+/59"), timeout=GENERATION_TIMEOUT_MS)
        handle = backend.worker.current
        assert handle is not None, "the job ended before the tab was closed"
        other.close()  # the person went away: the tab's unload or the dropped event stream stops the job at its next step
        with pytest.raises(Cancelled, match=r"cancelled (\(the client went away\) )?after \d+ of 59 steps"):
            handle.result(timeout=60)


def test_grid_shows_every_cell_with_captions_and_phones_read_in_order(page, browser, app):
    pick_demo(page, DEMO)
    set_number(page, "#steps", "2")
    open_tab(page, "Grid")
    type_into(page, "#grid-scales", "0.5, 1")
    page.locator("#grid-run").click()
    expect(page.locator("#grid-status")).to_contain_text("Done: 4 cells", timeout=3 * GENERATION_TIMEOUT_MS)
    grid = page.locator("#grid-view table")
    box = grid.bounding_box()
    thumbnails = grid.locator("img")
    expect(thumbnails).to_have_count(5)  # 4 cells and the no-LoRA baseline
    for index in range(5):  # every row inside the grid, none cut off
        thumb = thumbnails.nth(index).bounding_box()
        assert box["y"] <= thumb["y"] and thumb["y"] + thumb["height"] <= box["y"] + box["height"] + 1
    # the default alphas: the trained Turbo alpha (1) and the alpha = rank fallback (16) of the demo LoRA
    expect(grid.get_by_text("α 1 × 0.5", exact=True)).to_be_visible()
    expect(grid.get_by_text("α 16 × 1", exact=True)).to_be_visible()
    expect(page.locator("#grid-view").get_by_text("seed 7", exact=True)).to_be_visible()
    for header in page.locator("#grid-table th").all():  # one line each: no "scal/e"
        assert header.bounding_box()["height"] < 48, header.inner_text()

    phone = open_app(browser, app[0], width=400, height=800)
    try:  # the numbered order, 1 · Adapter, 2 · Request, then Generate (docs/ui.md): the adapter is picked first
        request = phone.get_by_text("2 · Request", exact=True).bounding_box()["y"]
        assert phone.get_by_text("1 · Adapter", exact=True).bounding_box()["y"] < request
        assert request < phone.locator("#generate").bounding_box()["y"]
        for name in ("Grid", "History"):
            expect(phone.get_by_role("tab", name=name)).to_be_visible()
    finally:
        phone.close()


def test_the_api_page_describes_every_endpoint(page, app):
    page.get_by_text("Use via API").first.click()
    expect(page.get_by_text("/check_equivalence").first).to_be_visible()
    page.wait_for_timeout(1000)
    text = page.locator("body").inner_text()
    assert "adapter source: Hub repo id" in text and "value_" not in text and "``" not in text


def test_generate_says_what_it_applies_before_load(page):
    pick_demo(page, DEMO)
    note = page.locator("#apply-note")
    expect(note).to_contain_text(f"Generate applies adapter 1: {DEMO}")
    expect(note).to_contain_text("not loaded yet")
    page.locator("#slot1-load").click()
    expect(page.locator("#slot1-report")).to_contain_text("Loaded", timeout=GENERATION_TIMEOUT_MS)
    expect(note).to_contain_text("— loaded.")


def test_an_upload_shows_its_file_name_not_the_server_folder(page):
    from h3app.backend.service import DEMO_ADAPTERS_DIR

    with page.expect_file_chooser() as chooser:
        page.locator("#slot1-upload").click()
    chooser.value.set_files(str(DEMO_ADAPTERS_DIR / DEMO))
    expect(page.locator("#slot1-source textarea")).to_have_value(f"upload: {DEMO}")
    expect(page.locator("#slot1-inspect-card")).to_contain_text("format peft")  # read through the path in state
