"""A waiting page sees its place in the GPU worker's line while it waits (docs/ui.md, "Serving"): every GPU event
reaches the worker in local mode too (Gradio's one-slot queue once held it back, so "Queued (position 1)" showed only
when its turn came), and the Generate event's first answer behind a running job is its position."""

from __future__ import annotations

import threading
import time

import pytest

from h3app.backend.preview import PreviewBoard
from h3app.backend.worker import Progress
from h3app.hosting.gpu_gate import gpu_events
from h3app.ui.forms import JobForm, RequestForm
from h3app.ui.generate.events import GenerateEvents
from h3app.ui.generate.preview_stream import GeneratePreview, generate_update
from h3app.ui.session import RunningJobs, new_session

PROMPT = "a red ball moving right over a grey floor, low soft hum"


def test_local_gpu_events_reach_the_worker_as_hosted_ones_do(backend):
    assert not backend.hosted
    assert gpu_events(backend)["concurrency_limit"] == backend.worker.max_queue > 1


@pytest.mark.slow
def test_a_job_behind_a_running_one_is_told_its_place_while_it_waits(backend):
    events = GenerateEvents(backend, RunningJobs())
    form = JobForm(new_session(), "unmerged", RequestForm(prompt=PROMPT, seed=1, steps=4, height=16, width=16), "")
    hook = backend.model.transformer().register_forward_pre_hook(lambda *_: time.sleep(0.3))
    try:
        first = threading.Thread(target=lambda: events.generate_view(form, progress=None))
        first.start()
        deadline = time.monotonic() + 60
        while backend.worker.current is None and time.monotonic() < deadline:  # the first job is running
            time.sleep(0.02)
        assert backend.worker.current is not None
        board = PreviewBoard()
        views = events.generate_views(form, (), None, None, board)
        waiting = next(views)
        assert isinstance(waiting, Progress) and (waiting.phase, waiting.position) == ("queued", 1)
        note = generate_update(GeneratePreview("preview", "note"), board, waiting)["note"]
        assert note.startswith("Queued (position 1)")
        *_, view = views
        assert view.video
        first.join(120)
    finally:
        hook.remove()
