"""The page under the ZeroGPU stand-in (``H3APP_ZEROGPU_FORK=1``), in Debian's chromium: the quota line before
Generate, Load → Generate with every job a forked call, the same video hash as the in-process job with the settings
the mp4 records, and the equivalence check IDENTICAL."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from browser_fixtures import GENERATION_TIMEOUT_MS, open_app, open_tab, pick_demo, set_number, type_into
from playwright.sync_api import expect

from h3app.backend import media, zero_gpu
from h3app.backend.generation import GenerationRequest
from h3app.backend.service import Backend
from h3app.settings import LoRASettings

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]
DEMO = "lightx2v_turbo_no_alpha.safetensors"


def test_load_generate_and_check_in_the_browser_under_the_stand_in(tiny_model, browser, tmp_path, monkeypatch):
    from app_fixtures import running_app

    monkeypatch.setenv(zero_gpu.FORK_ENV, "1")
    forked = Backend(loaded=tiny_model, output_dir=tmp_path / "forked")
    forked.time_model = lambda request: {"video_s": 4.0, "step_s": 1.0, "evaluations": 2, "box": "this CPU"}
    try:
        with running_app(forked, preview_budget=None) as url:
            page = open_app(browser, url)
            try:
                expect(page.locator("#predicted-time")).to_contain_text("uses about 8 s of your ZeroGPU quota")
                pick_demo(page, DEMO)
                type_into(page, "#slot1-alpha", "8")
                page.locator("#slot1-load").click()
                expect(page.locator("#slot1-report")).to_contain_text("Loaded: all 24 targets bound",
                                                                      timeout=GENERATION_TIMEOUT_MS)
                set_number(page, "#steps", "3")
                page.locator("#generate").click()
                expect(page.locator("#result")).to_contain_text("effective 0.0625", timeout=GENERATION_TIMEOUT_MS)
                open_tab(page, "Equivalence")
                page.locator("#check").click()
                expect(page.locator("#verdict [data-testid=verdict]")).to_contain_text(
                    "IDENTICAL", timeout=3 * GENERATION_TIMEOUT_MS)
            finally:
                page.close()
        videos = sorted((tmp_path / "forked").rglob("*.mp4"), key=lambda p: p.stat().st_mtime)
        settings = next(s for s in map(media.read_settings, videos) if s and s.get("h3app") == "generate")
        calls = [call.mode for call in forked.wrap_job.calls]
    finally:
        forked.close()
    assert len(calls) >= 3 and set(calls) == {"fork"}  # Load, Generate and the check: each a forked call
    monkeypatch.delenv(zero_gpu.FORK_ENV)
    in_process = Backend(loaded=tiny_model, output_dir=tmp_path / "in-process")
    try:
        adapter = settings["adapters"][0]
        expected = in_process.generate(GenerationRequest(**settings["request"]),
                                       [LoRASettings(source=adapter["source"], alpha=8.0)]).result.hash
    finally:
        in_process.binder.reset()
        in_process.close()
    assert settings["hash"] == expected and re.fullmatch(r"sha256:[0-9a-f]{64}", expected)
    assert Path(adapter["source"]).name == DEMO
