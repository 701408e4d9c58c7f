"""The one door to Gradio's private API, for gradio 6.31.0 (refused at import on any other version).

h3app uses Gradio's public API everywhere else (``concurrency_limit``/``concurrency_id``, ``cancels``,
``demo.unload``, ``gr.Request``, ``gr.FileData``). What Gradio 6 offers no public hook for, read in its source and
replayed over HTTP (tests/test_public_space_queue.py, tests/test_public_space_abuse.py):

- ``client_gone``: whether the client of the running event went away. A queued event's ``gr.Request`` wraps the
  ``POST /queue/join`` request, answered before the event runs, so its ``is_disconnected()`` is True from the start.
  The client's real connection is its session's ``GET /queue/data`` event stream; when that drops (a closed tab, an
  API client that gives up), or on ``/cancel``, Gradio marks the session's running events not ``alive`` but does not
  stop them: a plain function runs to its end. So the check reads the event's ``alive`` flag, found through the
  event context (``LocalContext``) and the app's queue (``blocks._queue``).
- ``current_request``: the request of the running event, for a function that takes no ``gr.Request`` argument
  (``LocalContext.request``).
- ``wrap_events``: every event function of an app wrapped once it is built (``Blocks.fns``; each ``fn`` replaced).
- ``hook_queue``, on the app's queue after ``Blocks.queue``:
  - ``POST /gradio_api/cancel`` cancels the event's asyncio task, but a plain function runs on in its worker thread
    and the event stays ``alive``. Here a cancel also marks the event not ``alive`` (``Queue.remove_from_queue``);
    ``client_gone`` then stops the job at its next step.
  - An event queued by ``POST /queue/join`` runs whether or not anyone ever opens its session's event stream. Here
    the session's message queue (``Queue.pending_messages_per_session``, an ``asyncio.Queue``; its class swapped for
    one that records reads, its waiting messages kept) records when the stream reads; an event whose stream was not
    reading within ``LIMITS.abandon_seconds`` of its join counts as gone.
  - ``Queue.push`` refuses only when the whole queue (``max_size``) is full. Here a :class:`JoinGate` (hosted mode:
    ``hosting.join_bound``) may refuse a join at once: the refusal is answered the way Gradio answers a cached
    event (a ``gradio.queueing.Event`` with one completed message), without entering the queue.
  - Gradio answers a page's events in whatever order their runs end (queue-less ones run side by side in worker
    threads). ``sent_order`` numbers each event when it reaches the server — a queued one at its join
    (``Queue.push``), a queue-less one when its request starts processing (``Blocks.process_api``, an instance
    attribute shadowing the method; nothing awaits between the route and that call) — so that
    ``change_events.AnswerOrder`` can drop an answer older than one already written to the same output.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
import weakref
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from ..hosting.limits import LIMITS
from ..rules.versions import check_written_for

WRITTEN_FOR = "6.31.0"
check_written_for("gradio", WRITTEN_FOR, __name__)

__all__ = ["WRITTEN_FOR", "Join", "JoinGate", "WatchedMessages", "client_gone", "current_request", "hook_queue",
           "never_listened", "sent_order", "wrap_events"]

_SENT: ContextVar[int | None] = ContextVar("h3_sent_order", default=None)
_ARRIVALS = itertools.count(1)  # one count for the process: next() on it is atomic under the GIL


def sent_order() -> int | None:
    """The running event's place in the order events reached this server (larger: later), set by
    :func:`hook_queue`'s hooks; None outside an event of a hooked app (a direct call, e.g. in a test)."""
    return _SENT.get()


def current_request() -> Any:
    """The ``gr.Request`` of the Gradio event running in this context (None outside one)."""
    from gradio.context import LocalContext

    return LocalContext.request.get(None)


def client_gone() -> Callable[[], bool] | None:
    """For the Gradio event running in this context: a check that says True once its client went away. None outside
    a queued event (a direct call, e.g. in a test): nothing to watch."""
    from gradio.context import LocalContext

    blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    queue = getattr(blocks, "_queue", None)
    event = queue.event_ids_to_events.get(event_id) if queue is not None and event_id else None
    if event is None:
        return None
    return lambda: not getattr(event, "alive", True) or never_listened(queue, event)


@dataclass(frozen=True)
class EventFunction:
    """One event of a built app, as :func:`wrap_events` shows it: its function, name, outputs, whether it runs on
    the queue, and its API visibility (``"public"``, ``"private"``, …)."""

    fn: Callable[..., Any]
    api_name: str | None
    outputs: list[Any]
    queued: bool
    api_visibility: str


def event_functions(demo: Any) -> Iterator[EventFunction]:
    """Every event of ``demo`` that has a function."""
    for block_fn in demo.fns.values():
        if block_fn.fn is not None:
            yield _event(block_fn)


def _event(block_fn: Any) -> EventFunction:
    return EventFunction(block_fn.fn, block_fn.api_name, list(block_fn.outputs), block_fn.queue is not False,
                         block_fn.api_visibility)


def wrap_events(demo: Any, wrap: Callable[[EventFunction], Callable[..., Any]]) -> None:
    """Replace every event function of ``demo`` by ``wrap(event)``, once (a wrapped function is marked)."""
    for block_fn in demo.fns.values():
        if block_fn.fn is None or getattr(block_fn.fn, "__h3_guarded__", False):
            continue
        wrapped = wrap(_event(block_fn))
        wrapped.__h3_guarded__ = True  # type: ignore[attr-defined]
        block_fn.fn = wrapped


class WatchedMessages(asyncio.Queue):
    """A session's message queue that knows whether its event stream reads from it: ``readers`` waiting now,
    ``read_at`` (monotonic seconds) the last read."""

    readers = 0
    read_at = -math.inf

    async def get(self) -> Any:
        self.readers += 1
        try:
            return await super().get()
        finally:
            self.readers -= 1
            self.read_at = time.monotonic()


def never_listened(queue: Any, event: Any, now: float | None = None) -> bool:
    """True when ``event`` was joined more than ``LIMITS.abandon_seconds`` ago and its session's event stream has
    not read since (False when the session's queue is not watched: nothing to judge by)."""
    messages = queue.pending_messages_per_session.get(event.session_hash)
    if not isinstance(messages, WatchedMessages):
        return False
    listened = messages.readers > 0 or messages.read_at >= event.enqueue_time
    return not listened and (now or time.monotonic()) - event.enqueue_time > LIMITS.abandon_seconds


@dataclass(frozen=True)
class Join:
    """A ``POST /queue/join`` as a :class:`JoinGate` sees it: the HTTP request's ``headers`` and ``client``, the
    session, and the event's concurrency (``queued``: False for an event that runs off the queue)."""

    headers: Any
    client: Any
    session_hash: str | None
    queued: bool
    concurrency_id: str | None


class JoinGate(Protocol):
    """Decides, before an event enters Gradio's queue, whether it may."""

    def refusal(self, join: Join, waiting: Callable[[str], bool]) -> str | None:
        """The one line that refuses ``join`` (None: admitted); ``waiting(event_id)``: whether an event the gate
        admitted is still in the queue (waiting or running)."""

    def joined(self, join: Join, event_id: str) -> None:
        """``join`` entered the queue as ``event_id``."""


def hook_queue(demo: Any, gate: JoinGate | None = None) -> None:
    """Hook ``demo``'s queue (see the module docstring): cancels that stop, joins nobody listens to, ``gate``'s
    refusals before a join can wait, and each event numbered in the order it arrived (:func:`sent_order`)."""
    queue = demo._queue
    events: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
    arrived: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # a queued event → its join's number
    push, remove, process = queue.push, queue.remove_from_queue, demo.process_api

    async def hooked_push(body: Any, request: Any, username: str | None) -> Any:
        number = next(_ARRIVALS)  # before any await: joins are numbered in the order they arrive
        fn = queue.blocks.fns.get(body.fn_index) if body.fn_index is not None else None
        join = Join(request.headers, request.client, body.session_hash, fn is not None and fn.queue is not False,
                    getattr(fn, "concurrency_id", None))
        refusal = gate.refusal(join, queue.event_ids_to_events.__contains__) if gate and fn is not None else None
        if refusal is not None:
            return await _refuse(queue, body, fn, request, username, refusal)
        success, event_id, state = await push(body=body, request=request, username=username)
        if success and isinstance(event_id, str):
            event = queue.event_ids_to_events.get(event_id)
            if event is not None:
                events[event_id] = event
                arrived[event] = number
            if gate is not None and fn is not None:
                gate.joined(join, event_id)
            messages = queue.pending_messages_per_session.get(body.session_hash)
            if type(messages) is asyncio.Queue:
                messages.__class__ = WatchedMessages  # the same queue, its waiting messages kept
        return success, event_id, state

    async def hooked_remove(event_id: str) -> None:
        event = events.get(event_id)  # /cancel: the running event too, not only a waiting one
        if event is not None:
            event.alive = False
        await remove(event_id)

    async def numbered_process(*args: Any, **kwargs: Any) -> Any:
        """Every run of an event (queued: numbered at its join; direct: now, before anything awaits)."""
        event = events.get(kwargs.get("event_id") or "")
        number = arrived.get(event) if event is not None else None
        token = _SENT.set(number if number is not None else next(_ARRIVALS))
        try:
            return await process(*args, **kwargs)
        finally:
            _SENT.reset(token)

    queue.push, queue.remove_from_queue = hooked_push, hooked_remove
    demo.process_api = numbered_process


async def _refuse(queue: Any, body: Any, fn: Any, request: Any, username: str | None, message: str) -> Any:
    """Answer a join at once with ``message`` as the event's error, the way Gradio answers a cached event: the
    client reads it from its event stream like any other error; nothing enters the queue."""
    from gradio.queueing import Event
    from gradio.server_messages import ProcessCompletedMessage

    event = Event(body.session_hash, fn, request, username)
    async with queue.pending_message_lock:
        if event.session_hash not in queue.pending_messages_per_session:
            queue.pending_messages_per_session[event.session_hash] = WatchedMessages()
        queue.pending_event_ids_session.setdefault(event.session_hash, set()).add(event._id)
    queue.send_message(event, ProcessCompletedMessage(
        output={"error": message, "visible": True, "title": "Error", "duration": None}, title="Error",
        success=False))
    return True, event._id, "success"
