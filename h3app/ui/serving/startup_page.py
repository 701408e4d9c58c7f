"""The page a Space shows while the app starts: first-start download progress (about 124 GB) and then the load.

A real model's weights take many minutes to download on a first start and a Space shows nothing until its port
answers, so while ``locate`` downloads and the backend loads, :func:`while_starting` serves this small page on the
app's own port: one Markdown, redrawn every two seconds by a ``gr.Timer``, with the progress line
("Downloading MiniMax-H3 weights: 34.2 of 124 GB (28 %) …") and the last line the app logged (not on a public
Space: a library's log line can name server folders). The same progress
line goes to the log every 30 seconds. When the backend is ready the page is closed and the real app takes the
port. Progress comes from :class:`h3app.model.repo.DownloadProgress` (byte counts of the Hugging Face cache), which
app.py hands in: the UI reads the download, it does not start or inspect it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ...rules.units import byte_unit

LOG = logging.getLogger("h3app.startup")
REDRAW_SECONDS = 2.0
LOG_EVERY_SECONDS = 30.0


def _amount(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def progress_text(done: int, total: int | None, name: str = "MiniMax-H3") -> str:
    """One line for ``done`` of ``total`` bytes, both in the larger one's decimal unit (the percentage rounded
    down, so 100 % means every byte is there)."""
    unit, scale = byte_unit(max(done, total or 0))
    if not total:
        return f"Downloading {name} weights: {_amount(done / scale)} {unit} so far …"
    if done >= total:
        return f"Downloaded {name} weights ({_amount(total / scale)} {unit}); loading them …"
    return (f"Downloading {name} weights: {_amount(done / scale)} of {_amount(total / scale)} {unit} "
            f"({done * 100 // total} %) …")


class _LastLine(logging.Handler):
    """Keeps the last message logged under the loggers it is attached to."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.line = ""

    def emit(self, record: logging.LogRecord) -> None:
        if record.name != LOG.name:  # the page already shows the progress line
            self.line = (record.getMessage().splitlines() or [""])[0]


class StartupPage:
    """The startup page for one model; ``progress()`` returns ``(done, total)`` bytes (total None: unknown)."""

    def __init__(self, name: str, progress: Callable[[], tuple[int, int | None]], show_log: bool = True) -> None:
        self.name = name
        self.progress = progress
        self.show_log = show_log
        self.last = _LastLine()
        self.demo: Any = None
        self._stop = threading.Event()
        self._logger: threading.Thread | None = None

    def text(self) -> str:
        """The Markdown shown: the progress line, then the last logged line (unless ``show_log`` is off)."""
        done, total = self.progress()
        line = progress_text(done, total, self.name)
        last = self.last.line if self.show_log else ""
        return f"### H3 LoRA Lab is starting\n\n{line}" + (f"\n\n`{last}`" if last else "")

    def build(self) -> Any:
        import gradio as gr

        with gr.Blocks(title="H3 LoRA Lab — starting") as demo:
            status = gr.Markdown(self.text)
            gr.Timer(REDRAW_SECONDS).tick(self.text, outputs=status, show_progress="hidden")
            gr.api(self.text, api_name="status")
        return demo

    def open(self, **launch: Any) -> StartupPage:
        """Serve the page (Gradio's host and port, as the app's own launch uses) and log progress every 30 s."""
        for name in ("h3app", "huggingface_hub"):
            logging.getLogger(name).addHandler(self.last)
        self.demo = self.build()
        self.demo.launch(prevent_thread_lock=True, quiet=True, **launch)
        self._logger = threading.Thread(target=self._log_progress, name="h3app-startup-log", daemon=True)
        self._logger.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self.demo is not None:
            self.demo.close()
        for name in ("h3app", "huggingface_hub"):
            logging.getLogger(name).removeHandler(self.last)

    def _log_progress(self) -> None:
        while not self._stop.wait(LOG_EVERY_SECONDS):
            done, total = self.progress()
            LOG.warning(progress_text(done, total, self.name))


class DownloadSource(Protocol):
    """What the page reads: ``repo_id``, ``total`` bytes, ``missing`` bytes when it began, ``done()`` bytes now
    (:class:`h3app.model.repo.DownloadProgress`)."""

    repo_id: str
    total: int
    missing: int

    def done(self) -> int: ...


@contextlib.contextmanager
def while_starting(download: DownloadSource | None, show_log: bool = True,
                   **launch: Any) -> Iterator[StartupPage | None]:
    """Serve the startup page during the block while ``download`` (from ``repo.pending_download``) has bytes to
    fetch; nothing when it is None or complete. The page is closed when the block ends, whatever happens in it.
    ``show_log=False`` (a public Space) keeps library log lines, which can name server folders, off the page."""
    if download is None or not download.missing:
        yield None
        return
    model = download.repo_id
    page = StartupPage(model.rsplit("/", 1)[-1], lambda: (download.done(), download.total), show_log)
    LOG.warning("first start of %s: %s (this page shows progress until the app is ready)", model,
                progress_text(download.done(), download.total, page.name))
    started = time.monotonic()
    page.open(**launch)
    try:
        yield page
    finally:
        page.close()
        LOG.warning("%s ready after %.0f s", model, time.monotonic() - started)
