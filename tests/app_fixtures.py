"""The real app (``build_app`` + ``launch``) on 127.0.0.1 for the HTTP and browser tests, and Debian's chromium
driven by Playwright (no Playwright browser download)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from h3app.ui.app_ui import build_app, launch_kwargs

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def running_app(backend: Any, preview_budget: Any = "page", **overrides: Any) -> Iterator[str]:
    """Launch the app on ``backend`` (free port on loopback, the app's own launch settings plus ``overrides``);
    yield its local URL; close it afterwards. ``preview_budget``: ``build_app``'s ("page": the app's own)."""
    demo = build_app(backend) if preview_budget == "page" else build_app(backend, preview_budget=preview_budget)
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True,
                **{**launch_kwargs(backend), **overrides})
    try:
        yield demo.local_url
    finally:
        demo.close()


@contextmanager
def chromium() -> Iterator[Any]:
    """One headless Debian chromium (``apt-get install chromium``): the session's ``browser`` (tests/browser_fixtures.py)."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    assert executable, "Debian's chromium is required: apt-get install chromium (scripts/test.sh does it)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
