"""Whether the client of the running Gradio event went away: the ``abandoned()`` check the backend polls while a
job waits or runs (``Backend.run``, ``Backend.grid``), so that a visitor who gives up frees the GPU.

What Gradio 6 offers, read in its source and checked on a live server: a queued event's ``gr.Request`` wraps the
``POST /queue/join`` request, answered before the event runs, so its ``is_disconnected()`` is True from the start
(it reads that finished request's receive channel). The client's real connection is its session's
``GET /queue/data`` event stream; when that drops (a closed tab, an API client that gives up), or on ``/cancel``,
Gradio marks the session's running events not ``alive`` but does not stop them: a plain function runs to its end, a
generator stops at its next ``yield``. So the check reads the event's ``alive`` flag, found through Gradio's event
context (tests/test_public_space_abuse.py replays it over HTTP); ``queue_hooks.py`` makes a ``/cancel`` clear that
flag too, and counts a join whose event stream never opened as gone.
"""

from __future__ import annotations

from collections.abc import Callable


def client_gone() -> Callable[[], bool] | None:
    """For the Gradio event running in this context: a check that says True once its client went away. None outside
    a queued event (a direct call, e.g. in a test): nothing to watch."""
    from gradio.context import LocalContext

    blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    queue = getattr(blocks, "_queue", None)
    event = queue.event_ids_to_events.get(event_id) if queue is not None and event_id else None
    if event is None:
        return None
    from .queue_hooks import never_listened

    return lambda: not getattr(event, "alive", True) or never_listened(queue, event)
