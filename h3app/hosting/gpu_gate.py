"""GPU events of a hosted app admitted (or refused) before they wait, and the Gradio concurrency that lets them.

In hosted mode every GPU event (load, generate, check, grid — UI and API) runs inside the backend's
``Admission`` (``admission.py``): at most ``gpu_per_visitor`` per visitor and ``gpu_pending`` in all wait or run;
more are refused at once with one line. Gradio's own queue must never hold the surplus (its ``max_size`` counts
every waiting event, cheap ones included), so the GPU events get ``gpu_pending + refusal_slots`` concurrent slots:
the admitted ones wait inside their handler for the backend's single worker, and a few slots stay free so that a
refusal is answered in milliseconds. Cheap events run off the queue or under their own concurrency ids. Local mode
keeps one GPU slot and Gradio's queue bounded by the worker's line (no visitors to tell apart).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Protocol

import gradio as gr

from .admission import OWNER, Admission, Refused
from .limits import LIMITS
from .visitors import visitor_keys

GPU_CONCURRENCY_ID = "gpu"


class _WorkerLine(Protocol):
    @property
    def max_queue(self) -> int:
        """Jobs the backend's worker lets wait."""
        ...


class GatedBackend(Protocol):
    """What the gate reads of the app's ``Backend`` (``backend.service``, which hosting/ may not import): whether
    it is hosted, its admission, and its worker's line."""

    @property
    def hosted(self) -> bool: ...

    @property
    def admission(self) -> Admission: ...

    @property
    def worker(self) -> _WorkerLine: ...


def gpu_events(backend: GatedBackend) -> dict[str, Any]:
    """Event keyword arguments of a GPU event on ``backend``'s app. Either mode lets every queued job reach the
    backend's one worker (which runs them one at a time), so a waiting page sees its true place in that line
    ("Queued (position 2)") while it waits, not only when its turn comes: hosted, as many as admission holds (and
    the refusal slots that answer the rest); local, as many as the worker's line (Gradio's queue has that bound)."""
    limit = backend.admission.max_pending + LIMITS.refusal_slots if backend.hosted else backend.worker.max_queue
    return {"concurrency_id": GPU_CONCURRENCY_ID, "concurrency_limit": limit}


def queue_size(backend: GatedBackend) -> int:
    """Gradio's ``max_size`` for ``backend``'s app."""
    return LIMITS.gradio_queue if backend.hosted else backend.worker.max_queue


def admitted(fn: Callable[..., Any], backend: GatedBackend) -> Callable[..., Any]:
    """``fn`` (a GPU event taking a ``gr.Request`` argument) held in ``backend``'s admission in hosted mode;
    unchanged in local mode. A refusal is one ``gr.Error`` line, before anything waits."""
    if not backend.hosted:
        return fn

    def acquire(args: tuple, kwargs: dict) -> list[str]:
        request = next((v for v in (*args, *kwargs.values()) if isinstance(v, gr.Request)), None)
        keys = visitor_keys(request)
        try:
            backend.admission.acquire(keys)
        except Refused as error:
            raise gr.Error(str(error), print_exception=False) from None
        OWNER.set(keys[-1])  # the worker serves visitors (their share: the address key) round-robin
        return keys

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stream(*args: Any, **kwargs: Any) -> Any:
            keys = acquire(args, kwargs)
            try:
                yield from fn(*args, **kwargs)
            finally:
                backend.admission.release(keys)
        return stream

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        keys = acquire(args, kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            backend.admission.release(keys)
    return call
