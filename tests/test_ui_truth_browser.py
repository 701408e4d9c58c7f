"""What a person sees is what runs, in Debian's chromium against the app on the tiny checkpoint (the session's one app
and one browser; the fewest steps and the smallest canvas):

- a demo adapter, picked in a fresh session, generates from the page: a video, a caption naming the adapter with
  every distinct alpha and effective scale it applied, no error text (three demos, one per way the page reaches
  the caption; all nine through the same event in tests/test_ui_summary.py);
- a source the person typed survives a demo pick until they confirm; a pasted alpha is what the next job applies,
  and the line above Generate says so before the click;
- every input of the page refuses an out-of-range value in one line where the person looks, keeps the value as
  typed (no clamp), and the server logs no traceback;
- at 400 px after a grid nothing sticks out past the right edge outside a scrolling box, and a click on a grid cell
  plays it beside the no-LoRA baseline;
- the API page shows each parameter's range and the ``adapters_json`` schema.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from browser_fixtures import inspected, open_app, open_tab, pick_demo
from playwright.sync_api import expect

from h3app.adapters.inspect import inspect_file
from h3app.adapters.known import TINY_DEMO_DIR
from h3app.adapters.resolved import resolve_adapter
from h3app.adapters.summary import AdapterSummary, describe
from h3app.ui.session import ADAPTERS_JSON_EXAMPLE

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DEMOS = sorted(p for p in TINY_DEMO_DIR.iterdir() if p.suffix == ".safetensors" or p.is_dir())
TURBO = "tiny_turbo_4step.safetensors"
JOB_TIMEOUT_MS = 120_000

# Elements wider than the screen whose overflow no ancestor scrolls (an ancestor with overflow hidden cuts them).
CUT_OFF_JS = """() => {
  const right = document.documentElement.clientWidth + 1, cut = [];
  for (const e of document.querySelectorAll('body *')) {
    const box = e.getBoundingClientRect();
    if (!box.width || !box.height || box.right <= right || e.closest('[hidden]')) continue;
    const style = getComputedStyle(e);
    if (style.visibility === 'hidden' || style.display === 'none') continue;
    let p = e.parentElement, scrolls = false;
    for (; p; p = p.parentElement) {
      const o = getComputedStyle(p).overflowX;
      if ((o === 'auto' || o === 'scroll') && p.getBoundingClientRect().right <= right) { scrolls = true; break; }
    }
    if (!scrolls) cut.push(`${e.tagName.toLowerCase()}#${e.id}.${e.className} right=${Math.round(box.right)}`);
  }
  return cut;
}"""


def box_of(page, selector: str):
    return page.locator(selector).locator("input[type=number], textarea, input[type=text]").first


def type_into(page, selector: str, text: str):
    """Put ``text`` in the box at once (as a paste does: one change, not one per keystroke), then leave it (the
    blur that a slider's number box clamps on)."""
    box = box_of(page, selector)
    box.fill(text)
    box.press("Tab")
    return box


def fastest_request(page) -> None:
    """2 steps (one evaluation) on a 16 × 16 canvas."""
    type_into(page, "#steps", "2")
    page.get_by_text("Canvas and flow shifts").click()
    type_into(page, "#height", "16")
    type_into(page, "#width", "16")


def error_texts(page) -> list[str]:
    """Where Gradio's red "Error" badges and toasts show (the id of the component they sit on)."""
    found = page.get_by_text(re.compile(r"^Error$")).locator("visible=true")
    return [found.nth(i).evaluate("e => (e.closest('[id]') || e).id") for i in range(found.count())]


def summary_words(demo: Path) -> str:
    config = demo / "adapter_config.json" if demo.is_dir() else None
    path = demo / "adapter_model.safetensors" if demo.is_dir() else demo
    return describe(AdapterSummary.of(resolve_adapter(inspect_file(path, adapter_config_path=config))))


# Through chromium, one demo per way the page reaches a caption: a folder with adapter_config.json (rsLoRA), an
# alpha from the registry, per-group alphas and ranks. Every demo adapter runs through the same Generate event in
# tests/test_ui_summary.py (the caption's words, the history label, the settings JSON), without a browser.
PAGE_DEMOS = ("peft_rslora", "lightx2v_turbo_no_alpha.safetensors", "native_larry_mixed_rank.safetensors")


def test_the_page_demos_are_demos():
    assert set(PAGE_DEMOS) <= {demo.name for demo in DEMOS}


@pytest.mark.parametrize("demo", [TINY_DEMO_DIR / name for name in PAGE_DEMOS], ids=lambda p: p.name)
def test_a_demo_adapter_generates_from_the_page(browser, app, demo):
    page = open_app(browser, app[0], 1400)
    try:
        fastest_request(page)
        pick_demo(page, demo.name)
        page.locator("#generate").click()
        caption = page.locator("#result [data-testid=applied]")
        expect(caption).to_contain_text(demo.name, timeout=JOB_TIMEOUT_MS)
        expect(caption).to_contain_text(summary_words(demo))  # every distinct alpha and scale it applied
        expect(page.locator("#video video")).to_have_count(1)
        assert page.locator("#generate-status").inner_text().strip() == ""
        assert error_texts(page) == []
    finally:
        page.close()


def test_typed_inputs_are_never_lost(browser, app):
    page = open_app(browser, app[0], 1400)
    try:
        fastest_request(page)
        source = type_into(page, "#slot1-source", "owner/my-lora")
        pick_demo(page, TURBO, wait=False)
        question = page.locator("#slot1-demo-confirm")
        expect(question).to_contain_text("owner/my-lora")
        expect(source).to_have_value("owner/my-lora")  # the pick waits for the person's word
        page.locator("#slot1-demo-replace").click()
        expect(source).to_have_value(re.compile(re.escape(TURBO) + "$"))
        inspected(page)
        expect(question).to_be_hidden()
        # a pasted alpha (no keystroke: Gradio's input event does not fire) is what the next job applies
        alpha = box_of(page, "#slot1-alpha")
        alpha.click()
        alpha.press("Control+a")
        page.keyboard.insert_text("8")
        page.locator("#generate").click()  # at once: before the Override tick has come back
        expect(page.locator("#apply-note")).to_contain_text("alpha 8 (typed) × scale 1 → effective 0.5")
        expect(page.locator("#result [data-testid=applied]")).to_contain_text("alpha 8 (typed)",
                                                                              timeout=JOB_TIMEOUT_MS)
        expect(page.locator("#slot1-override input")).to_be_checked()
    finally:
        page.close()


# Each input of the page, once: (how to reach it, what to type, where the refusal shows, its words, a good value).
BAD_VALUES = [
    ("#slot1-alpha", "1e9", "#slot1-alpha-card", "at most 1e+06", ""),
    ("#slot1-scale", "1e9", "#slot1-alpha-card", "scale must be finite and between -100 and 100", "1"),
    ("#slot1-scale", "5", "#slot1-alpha-card", "outside the Scale slider's range (between -2 and 4)", "1"),
    ("#seed", "7.5", "#request-note", "seed must be a whole number", "7"),
    ("#steps", "1000", "#request-note", "steps must be a whole number between 2 and 200", "2"),
    ("#duration", "20", "#request-note", "duration must be between 5 and 14.375", "5"),
    ("#height", "12", "#request-note", "height must be a positive multiple of 8", "16"),
    ("#width", "-16", "#request-note", "width must be at least 1", "16"),
    ("label=Video shift", "-1", "#request-note", "shift must be a positive number", "0"),
    ("label=Audio shift", "-2", "#request-note", "audio_shift must be a positive number", "0"),
]
# The Equivalence boxes start at adapter 1's pair (the demo Turbo: A = 1 × 1, B = 16 × 0.0625).
CHECK_VALUES = [("#a-alpha", "-1", "setting A: alpha must be", "1"), ("#a-scale", "1e9", "setting A: scale", "1"),
                ("#b-alpha", "2e6", "setting B: alpha must be", "16"),
                ("#b-scale", "-101", "setting B: scale", "0.0625")]
GRID_VALUES = [("#grid-alphas", "0", "> 0", "1, 16"), ("#grid-scales", "1e9", "between -100 and 100", "0.0625, 1"),
               ("#grid-seeds", "-1", "seed must be between 0", "7")]


def control(page, selector: str):
    if selector.startswith("label="):
        return page.get_by_label(selector.removeprefix("label="), exact=True)
    return box_of(page, selector)


def type_value(page, selector: str, text: str):
    """:func:`type_into` for any control (a number box, a slider's box, a text box)."""
    box = control(page, selector)
    box.fill(text)
    box.press("Tab")
    return box


def refused_where_looked(page, cases) -> None:
    """Each bad value: its one line where the person looks, the box still holding it; then a good value back."""
    for selector, bad, where, words, good in cases:
        box = type_value(page, selector, bad)
        assert box.input_value() == bad, f"{selector}: {bad} became {box.input_value()}"  # not clamped on blur
        expect(page.locator(where)).to_contain_text(words)
        assert box.input_value() == bad, f"{selector}: {bad} became {box.input_value()}"  # nor by the server
        type_value(page, selector, good)  # the next case is typed at once: the notes answer in the order sent
    expect(page.locator(where)).not_to_contain_text(words)


def test_every_input_refuses_out_of_range_in_one_line_without_clamping_or_traceback(browser, app, capfd):
    capfd.readouterr()
    page = open_app(browser, app[0], 1400)
    try:
        fastest_request(page)
        pick_demo(page, TURBO)
        refused_where_looked(page, BAD_VALUES)
        # a job clicked with a refused value: one line under the button, nothing run
        type_value(page, "#slot1-scale", "-3")
        page.locator("#generate").click()
        status = page.locator("#generate-status")
        expect(status).to_have_text("✖ Not run: the line above says why.")  # the alpha card says it, once
        type_value(page, "#slot1-scale", "1")
        expect(status).to_have_text("")  # fixed: gone
        type_value(page, "#seed", "-1")
        page.locator("#generate").click()
        expect(status).to_contain_text("✖ Not run: a request value is refused (the note under Steps says why)")
        expect(page.get_by_text(re.compile("seed must be between 0"))).to_have_count(1)
        type_value(page, "#seed", "7")
        expect(status).to_have_text("")
        open_tab(page, "Equivalence")
        expect(box_of(page, "#b-alpha")).to_have_value("16")  # the pair has followed the adapter
        refused_where_looked(page, [(s, bad, "#check-status", words, good) for s, bad, words, good in CHECK_VALUES])
        open_tab(page, "Grid")
        refused_where_looked(page, [(s, bad, "#grid-estimate", words, good) for s, bad, words, good in GRID_VALUES])
        type_value(page, "#grid-seeds", "-1")
        page.locator("#grid-run").click()
        expect(page.locator("#grid-status")).to_contain_text("✖ Not run: an axis is refused")
        # text too long: the source, refused in Inspect's card
        open_tab(page, "Generate")
        control(page, "#slot1-source").fill("x" * 5000)
        # Enter at once: the page's "source changed" clear, sent first, cannot cover Inspect's refusal when it
        # answers after it (docs/ui.md, "Events in order")
        control(page, "#slot1-source").press("Enter")
        # Inspect takes its turn in the queue behind the page's earlier events (a predicted-time note may rehearse
        # a new request first): on a loaded machine that is more than Playwright's default 5 s.
        expect(page.locator("#slot1-inspect-card [data-testid=refusal]")).to_contain_text("5,000 characters",
                                                                                          timeout=JOB_TIMEOUT_MS)
        assert error_texts(page) == []
    finally:
        page.close()
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err, (out + err)[-3000:]


def test_after_a_grid_at_400_px_nothing_is_cut_off_and_a_cell_plays_beside_the_baseline(browser, app):
    page = open_app(browser, app[0], width=400, height=900)
    try:
        fastest_request(page)
        pick_demo(page, TURBO)
        open_tab(page, "Grid")
        page.locator("#grid-run").click()
        expect(page.locator("#grid-status")).to_contain_text("Done: 4 cells", timeout=3 * JOB_TIMEOUT_MS)
        assert page.evaluate(CUT_OFF_JS) == []
        grid = page.locator("#grid-view table.h3cv-cells")
        grid.get_by_role("button", name=re.compile(r"α 16 × 1(?![.\d])")).click()
        players = page.locator("#grid-view .h3cv-players figcaption")
        expect(players).to_have_text([re.compile("no LoRA"), re.compile(r"α 16 × 1")])
        assert page.evaluate(CUT_OFF_JS) == []
    finally:
        page.close()


def test_the_api_page_shows_ranges_and_the_adapters_schema(browser, app):
    page = open_app(browser, app[0], 1400)
    try:
        page.get_by_text("Use via API").first.click()
        expect(page.get_by_text("/check_equivalence").first).to_be_visible()
        expect(page.locator("body")).to_contain_text(ADAPTERS_JSON_EXAMPLE)
        text = page.locator("body").inner_text()
        for words in ("seed: a whole number 0 to 9223372036854775807", "steps: a whole number 2 to 200",
                      "alpha: a number > 0 and at most 1e+06", "scale (strength): a number between -100 and 100",
                      "a multiple of 8"):
            assert words in text, words
    finally:
        page.close()
