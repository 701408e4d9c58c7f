"""The "Find on the Hub" panel in Debian's chromium, against the local Hub stand-in: search, pick a result, see its
preview in adapter 1 (header only: no weight file is downloaded) and the row marked ✓."""

from __future__ import annotations

import re

import pytest
from hub_catalog import LIGHTX2V, serve_catalog
from hub_server import FakeHub
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_search_pick_and_preview(page, fake_hub: FakeHub, tmp_path) -> None:
    """On the session's app (``page``: a fresh tab of its own); the Hub stand-in is read at call time."""
    serve_catalog(fake_hub, tmp_path / "repos")
    page.get_by_text("Find on the Hub").click()
    query = page.locator("#hub-query input")
    query.fill("turbo")
    query.press("Enter")
    results = page.locator("#hub-results")
    expect(page.locator("#hub-note")).to_contain_text("2 MiniMax-H3 adapter repos")
    expect(results).to_contain_text("★ h3_t2v_4step_v0.1.safetensors")
    expect(results).to_contain_text("minimax_h3_turbo_v4_step600_ema.safetensors")
    expect(results).not_to_contain_text("wan-turbo-lora")

    results.get_by_text("★ h3_t2v_4step_v0.1.safetensors").click()
    expect(page.locator("#slot1-source textarea")).to_have_value(LIGHTX2V)
    expect(page.locator("#slot1-weight input")).to_have_value(re.compile(r"h3_t2v_4step_v0\.1\.safetensors"))
    expect(page.locator("#slot1-inspect-card")).to_contain_text("format peft")
    expect(page.locator("#slot1-known-card")).to_contain_text("LightX2V H3 Turbo 4-step v0.1")
    expect(results).to_contain_text("✓ loads: peft, rank 128, alpha 8 (registry)")
    assert not [r for r in fake_hub.requests if r.is_full_get and r.path.endswith(".safetensors")]
