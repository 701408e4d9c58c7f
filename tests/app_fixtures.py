"""The real app (``build_app`` + ``launch``) on 127.0.0.1, for the HTTP and browser tests."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from h3app.ui.app_ui import build_app, launch_kwargs


@contextmanager
def running_app(backend: Any, **overrides: Any) -> Iterator[str]:
    """Launch the app on ``backend`` (free port on loopback, the app's own launch settings plus ``overrides``);
    yield its local URL; close it afterwards."""
    demo = build_app(backend)
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True,
                **{**launch_kwargs(backend), **overrides})
    try:
        yield demo.local_url
    finally:
        demo.close()
