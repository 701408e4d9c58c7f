"""Hooks on the app's Gradio queue (``install_queue_hooks``, after ``Blocks.queue``): cancels that stop, joins
nobody listens to, and a per-visitor bound on cheap events before they can wait in the queue.

What Gradio 6 does by itself, read in its source and replayed over HTTP (tests/test_public_space_queue.py):
- ``POST /gradio_api/cancel`` cancels the event's asyncio task, but a plain function runs on in its worker thread
  and the event stays ``alive``, so nothing told the job to stop. Here a cancel also marks the event not
  ``alive``; the job's ``client_gone`` check (``client_gone.py``) then stops it at its next step.
- An event queued by ``POST /queue/join`` runs whether or not anyone ever opens the session's event stream
  (``GET /queue/data``). Here the session's message queue records when the stream reads from it; an event whose
  stream was not reading within ``ABANDON_SECONDS`` of its join counts as abandoned.
- ``Queue.push`` refuses only when the whole queue (``max_size``) is full, which one visitor can fill for everyone.
  Here (hosted mode) a visitor with ``CHEAP_PER_VISITOR`` cheap events waiting or running gets its next one
  answered at once with one line, without entering the queue. GPU events are not counted here: they pass to
  their own bounded admission (``fair_queue.py``), whose refusals are answered at once too.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from typing import TYPE_CHECKING, Any

from .cheap_limit import CHEAP_PER_VISITOR, refusal
from .fair_queue import GPU_CONCURRENCY_ID, visitor_keys

if TYPE_CHECKING:
    from ..backend.service import Backend

ABANDON_SECONDS = 5.0  # a join whose event stream is not open by then counts as abandoned


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
    """True when ``event`` was joined more than ``ABANDON_SECONDS`` ago and its session's event stream has not
    read since (False when the session's queue is not watched: nothing to judge by)."""
    messages = queue.pending_messages_per_session.get(event.session_hash)
    if not isinstance(messages, WatchedMessages):
        return False
    listened = messages.readers > 0 or messages.read_at >= event.enqueue_time
    return not listened and (now or time.monotonic()) - event.enqueue_time > ABANDON_SECONDS


class _Request:
    """What ``visitor_keys`` reads, from the join's HTTP request and its session hash."""

    def __init__(self, request: Any, session_hash: str | None) -> None:
        self.headers, self.client, self.session_hash = request.headers, request.client, session_hash


def install_queue_hooks(demo: Any, backend: Backend) -> None:
    """Hook ``demo``'s queue (see the module docstring); the per-visitor bound only in hosted mode."""
    queue = demo._queue
    events: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
    cheap: dict[str, set[str]] = {}
    push, remove = queue.push, queue.remove_from_queue

    async def hooked_push(body: Any, request: Any, username: str | None) -> Any:
        fn = queue.blocks.fns.get(body.fn_index) if body.fn_index is not None else None
        keys = visitor_keys(_Request(request, body.session_hash)) if backend.hosted else []
        counted = fn is not None and fn.queue is not False and fn.concurrency_id != GPU_CONCURRENCY_ID and keys
        if counted:
            for key in keys:
                cheap[key] = {i for i in cheap.get(key, ()) if i in queue.event_ids_to_events}
                if not cheap[key]:
                    del cheap[key]
            if any(len(cheap.get(key, ())) >= CHEAP_PER_VISITOR for key in keys):
                return await _refuse(queue, body, fn, request, username, refusal())
        success, event_id, state = await push(body=body, request=request, username=username)
        if success and isinstance(event_id, str):
            event = queue.event_ids_to_events.get(event_id)
            if event is not None:
                events[event_id] = event
            if counted:
                for key in keys:
                    cheap.setdefault(key, set()).add(event_id)
            messages = queue.pending_messages_per_session.get(body.session_hash)
            if type(messages) is asyncio.Queue:
                messages.__class__ = WatchedMessages  # the same queue, its waiting messages kept
        return success, event_id, state

    async def hooked_remove(event_id: str) -> None:
        event = events.get(event_id)  # /cancel: the running event too, not only a waiting one
        if event is not None:
            event.alive = False
        await remove(event_id)

    queue.push, queue.remove_from_queue = hooked_push, hooked_remove


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


__all__ = ["ABANDON_SECONDS", "WatchedMessages", "install_queue_hooks", "never_listened"]
