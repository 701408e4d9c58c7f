"""The page's Grid tab with adapters as rows (issue 52): the estimate counts the adapters before it runs, the cells
sit under one row per adapter with its label, and — in chromium — three demo adapters as rows, a cell click plays
that cell beside the no-LoRA baseline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMOS = ROOT / "assets" / "adapters"
ROW_FILES = ("tiny_style_warm.safetensors", "tiny_turbo_4step.safetensors", "native_comfyui_alpha.safetensors")
JOB_TIMEOUT_MS = 360_000


@pytest.mark.slow
def test_grid_view_has_a_row_per_adapter_and_the_estimate_counts_them(backend):
    from h3app.ui.compare.events import ComparisonEvents
    from h3app.ui.forms import GridForm, JobForm, RequestForm
    from h3app.ui.session import RunningJobs

    events = ComparisonEvents(backend, RunningJobs())
    grid = GridForm(alphas="auto", scales="0.5, 1", seeds="1", rows=[str(DEMOS / name) for name in ROW_FILES[:2]])
    assert "**4 cells** (2 adapters × 1 alpha × 2 scales × 1 seed)" in events.estimate(grid)
    form = JobForm(None, "unmerged", RequestForm(prompt="rows", seed=1, steps=2, height=16, width=16))
    views = list(events.grid_view(form, grid, progress=None))
    last = views[-1]
    assert last.status.startswith("Done: 4 cells")
    [layout] = last.view["grids"]
    assert layout["corner"] == "adapter ╲ scale"
    assert [row["header"] for row in layout["rows"]] == ["tiny_style_warm", "tiny_turbo_4step"]
    assert all(None not in row["cells"] for row in layout["rows"])  # every cell placed under its adapter and scale
    assert list(last.table.iloc[:, 0]) == ["tiny_style_warm · auto"] * 2 + ["tiny_turbo_4step · auto"] * 2
    with pytest.raises(Exception, match="grid row"):
        events.plan(GridForm(alphas="auto", scales="1", seeds="1", rows=[f"{DEMOS},colour=red"]))


@pytest.mark.slow
@pytest.mark.browser
def test_three_demo_adapters_as_rows_and_a_cell_click_against_the_baseline(browser, app):
    from browser_fixtures import answered, open_app, open_tab
    from playwright.sync_api import expect

    page = open_app(browser, app[0], 1400)
    try:
        page.locator("#steps input[type=number]").fill("2")
        page.locator("#steps input[type=number]").press("Enter")
        open_tab(page, "Grid")
        rows = page.locator("#grid-rows input")
        for name in ROW_FILES:
            rows.click()
            page.get_by_role("option", name=name).click()
            answered(page)
        page.locator("#grid-alphas textarea, #grid-alphas input").first.fill("auto")
        page.locator("#grid-scales textarea, #grid-scales input").first.fill("1")
        answered(page)
        expect(page.locator("#grid-estimate")).to_contain_text("3 adapters")
        page.locator("#grid-run").click()
        expect(page.locator("#grid-status")).to_contain_text("Done: 3 cells", timeout=JOB_TIMEOUT_MS)
        grid = page.locator("#grid-view table.h3cv-cells")
        expect(grid.locator("thead").get_by_text("adapter ╲ scale", exact=True)).to_be_visible()
        for name in ROW_FILES:
            expect(grid.locator("tbody th").get_by_text(Path(name).stem, exact=True)).to_be_visible()
        grid.get_by_role("button", name=re.compile(r"tiny_turbo_4step · α auto × 1")).click()
        view = page.locator("#grid-view .h3cv-players")
        expect(view.locator("figcaption")).to_have_text(["no LoRA · seed 7", "tiny_turbo_4step · α auto × 1"])
    finally:
        page.close()


@pytest.mark.slow
def test_the_diff_panel_draws_the_heat_map_from_the_cli_json(backend, capsys):
    import json

    from cli_runner import run_cli

    from h3app.backend.adapter_diff import diff_adapters
    from h3app.ui.compare.diff_panel import heat_html, parse_side

    a, b = str(DEMOS / ROW_FILES[0]), f"{DEMOS / ROW_FILES[1]},scale=0.5"
    page = diff_adapters(backend.binder, parse_side(a, "A"), parse_side(b, "B"))
    cli = run_cli(capsys, "diff", a, b, "--model", "tiny", "--json")
    assert cli.code == 0, cli.err
    assert page["cosine"] == pytest.approx(json.loads(cli.out)["cosine"], abs=1e-12)  # one truth, two doors
    shown = heat_html(page)
    assert f"cosine {page['cosine']:+.3f}" in shown and "block 0" in shown and "outside the blocks" in shown
    assert shown.count("<td style=") == len(page["blocks"])  # one coloured cell per (block, group)
    with pytest.raises(Exception, match="unknown field"):
        parse_side(f"{a},colour=red", "A")
