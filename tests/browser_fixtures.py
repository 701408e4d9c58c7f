"""The app and the browser, shared by every browser and API test of the session (a plugin: tests/conftest.py
lists it in ``pytest_plugins``; ask for ``app``, ``browser`` or ``page`` by name, never import them).

- ``app``: one launch of the real app (``build_app`` + ``launch``, tests/app_fixtures.py) on a Backend over the
  session's tiny model, as ``(url, backend)``;
- ``browser``: one context (shared HTTP cache) in one headless Debian chromium driven by Playwright;
- ``page``: a fresh tab on the app for each test (its own Gradio session), closed afterwards.

Helpers every browser test shares (import them by name): ``open_app``, ``pick_demo`` and ``inspected`` (a demo
adapter in slot 1 and its card), ``answered`` and ``open_tab`` (wait for the page's own events), ``held_steps``
(a job slow enough to click Cancel on), ``shoot`` (screenshots), ``type_into``/``set_number``, ``record_text``.

Gradio keeps a heartbeat stream open for apps with session state, so a page never reaches Playwright's
"networkidle": wait for "load" and then for the app's own text (auto-waiting locators).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

GENERATION_TIMEOUT_MS = 120_000
PAGE_TIMEOUT_MS = 60_000  # a loaded 2-core machine: generous waits, auto-retrying


@pytest.fixture(scope="session")
def app(tiny_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    """``(url, backend)``: the app on 127.0.0.1 for the whole session."""
    from app_fixtures import running_app

    from h3app.backend.service import Backend

    backend = Backend(loaded=tiny_model, output_dir=tmp_path_factory.mktemp("browser_outputs"))
    try:
        # a preview after every step: the browser tests follow the stream step by step on the tiny model, whose
        # previews the page's budget would thin to the first (that budget: test_preview_budget.py, bench P6)
        with running_app(backend, preview_budget=None) as url:
            yield url, backend
    finally:
        backend.binder.reset()  # the model is shared with the rest of the session: leave it at its base
        backend.close()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One browser context in one headless chromium for the session (``new_page()`` opens a tab in it). Its tabs
    share the HTTP cache, so Gradio's ~120 script files are fetched and compiled once per worker: a tab shows the app
    in ~3 s instead of ~4 s on 2 cores. Tabs stay independent: a Gradio session lives in its tab, and the app keeps
    nothing in cookies or browser storage (Gradio's run history is off, ``launch_kwargs``)."""
    from app_fixtures import chromium

    with chromium() as launched:
        context = launched.new_context()
        try:
            yield context
        finally:
            context.close()


def open_app(browser: Any, url: str, width: int = 1440, height: int = 1000) -> Any:
    """A new tab (in the session's ``browser`` context) on the app at ``width`` × ``height`` px, once its Generate
    button shows."""
    from playwright.sync_api import expect

    page = browser.new_page()
    count_events_in_flight(page)
    page.set_viewport_size({"width": width, "height": height})
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    expect.set_options(timeout=PAGE_TIMEOUT_MS)
    page.goto(url)
    page.wait_for_load_state("load")
    expect(page.locator("#generate")).to_be_visible()
    return page


@pytest.fixture
def page(browser: Any, app: tuple[str, Any]) -> Iterator[Any]:
    page = open_app(browser, app[0])
    yield page
    page.close()


def type_into(page: Any, selector: str, text: str) -> None:
    """Type like a person (Gradio's .input fires on keystrokes), then leave the box."""
    box = page.locator(selector).locator("input, textarea").first
    box.click()
    box.press("Control+a")
    box.press_sequentially(text, delay=30)
    box.press("Tab")


def set_number(page: Any, selector: str, value: str) -> None:
    box = page.locator(f"{selector} input[type=number]")
    box.fill(value)
    box.press("Enter")


def error_badges(page: Any) -> int:
    """Gradio's red "Error" status badges shown on components."""
    return page.get_by_text("Error", exact=True).locator("visible=true").count()


def record_text(page: Any, selector: str) -> None:
    """Keep every text ``selector`` shows, in order, for :func:`seen_text`: a job's progress and a stream's steps
    pass quicker than Playwright polls on a fast machine (its waits retry at 0.1 to 1 s), so a test that needs to
    know a passing text was shown records it instead of waiting for it."""
    page.evaluate("""(selector) => {
        window.seen = window.seen || {};
        const seen = window.seen[selector] = [];
        const node = document.querySelector(selector);
        const note = () => { const text = node.innerText.trim(); if (seen.at(-1) !== text) seen.push(text); };
        new MutationObserver(note).observe(node, {subtree: true, childList: true, characterData: true});
        note();
    }""", selector)


def seen_text(page: Any, selector: str) -> str:
    """Every text :func:`record_text` saw ``selector`` show since it was called, joined by `` | ``."""
    return " | ".join(page.evaluate("(selector) => window.seen[selector]", selector))


EVENT_PATHS = ("/gradio_api/run/", "/gradio_api/queue/join")  # an event sent to the app (not its result stream)


def count_events_in_flight(page: Any) -> None:
    """Count the page's event requests still unanswered (``page.h3_in_flight``), for :func:`answered`."""
    in_flight: set[Any] = set()
    page.h3_in_flight = in_flight

    def sent(request: Any) -> None:
        if any(path in request.url for path in EVENT_PATHS):
            in_flight.add(request)

    page.on("request", sent)
    page.on("requestfinished", lambda request: in_flight.discard(request))
    page.on("requestfailed", lambda request: in_flight.discard(request))


def answered(page: Any, quiet_ms: int = 300, timeout_ms: int = PAGE_TIMEOUT_MS) -> None:
    """Wait until the page has had every event it sent answered and sent no new one for ``quiet_ms``.

    A pick or an Inspect sets off a chain of redraws (the card, the alpha box, the pair, the notes), and a redraw that
    arrives after the test has typed into a control it writes puts the control's value back; a person types after
    the page has answered, so a test that types right after such a chain waits for it here first."""
    deadline = time.monotonic() + timeout_ms / 1000
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        if page.h3_in_flight:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_ms / 1000:
            return
        page.wait_for_timeout(50)  # lets Playwright deliver the request events
    raise AssertionError(f"the page still had {len(page.h3_in_flight)} event(s) unanswered after {timeout_ms} ms")


def open_tab(page: Any, name: str) -> None:
    """Show the tab ``name`` and wait for its first values to be answered: Gradio draws a tab's controls when the
    tab is first shown, and their first change events (the notes and estimates they write) must not land over what
    the test types next."""
    page.get_by_role("tab", name=name).click()
    answered(page)


def inspected(page: Any, name: str | None = None) -> None:
    """Wait for Inspect's card in slot 1 — its answer, not its placeholder (which says "format" too), titled
    ``name`` when given — and for the redraws it set off (alpha box, pair, notes): an alpha typed before the answer
    lands is replaced by the file's own."""
    from playwright.sync_api import expect

    card = page.locator("#slot1-inspect-card")
    expect(card.locator("[data-testid=inspect-summary]")).to_be_visible()
    if name is not None:
        expect(card.locator(".h3-title")).to_have_text(name)
    answered(page)


def pick_demo(page: Any, name: str, wait: bool = True) -> None:
    """Choose the demo adapter ``name`` (a file or folder of assets/adapters) in slot 1's dropdown. A pick fills the
    source box and inspects at once; ``wait`` waits for that: the box naming it, then :func:`inspected` (a folder's
    card is titled by its weight file, so only a file's title is checked). ``wait=False``: the pick alone (one that
    asks first, when the box holds the person's own source)."""
    from playwright.sync_api import expect

    page.locator("#slot1-demo input").click()
    page.get_by_role("option", name=name, exact=True).click()
    if wait:
        expect(page.locator("#slot1-source textarea")).to_have_value(re.compile(re.escape(name) + "$"))
        inspected(page, name if name.endswith(".safetensors") else None)


@contextmanager
def held_steps(backend: Any, seconds: float = 0.2) -> Iterator[None]:
    """Each transformer evaluation of ``backend``'s model takes at least ``seconds``: a 60-step job runs for 12 s or
    more, so that a click on Cancel lands while it runs however fast the machine (the tiny model's 59 evaluations
    otherwise end in about a second)."""
    hook = backend.model.transformer().register_forward_pre_hook(lambda *_: time.sleep(seconds))
    try:
        yield
    finally:
        hook.remove()


def shoot(page: Any, name: str, tmp_path: Path, element: str | None = None) -> None:
    """A screenshot of the page (or of ``element``) in ``tmp_path``, copied to ``H3APP_SCREENSHOT_DIR`` when set."""
    path = tmp_path / name
    (page.locator(element) if element else page).screenshot(path=str(path), **({} if element else
                                                                               {"full_page": True}))
    if os.environ.get("H3APP_SCREENSHOT_DIR"):
        shutil.copy(path, Path(os.environ["H3APP_SCREENSHOT_DIR"]) / name)
