"""Step previews through the UI's event functions (issue 36), without a browser: a hosted server's two visitors run
Generate at once through the fair queue, and each event streams only its own previews; the stream's lines."""

from __future__ import annotations

import threading
from typing import Any

import gradio as gr
import numpy as np
import pytest

from h3app.backend.preview import Preview, PreviewBoard
from h3app.backend.service import DEMO_ADAPTERS_DIR, Backend
from h3app.backend.worker import Progress
from h3app.hosting.gpu_gate import admitted
from h3app.ui.forms import JobForm, RequestForm
from h3app.ui.generate.events import GenerateEvents
from h3app.ui.generate.preview_stream import (
    CheckPreviews,
    GeneratePreview,
    check_finished,
    check_line,
    check_stopped_where,
    generate_finished,
    generate_update,
)
from h3app.ui.job_wiring import streamed_reply
from h3app.ui.session import RunningJobs, new_session

PROMPTS = {"ann": "a red ball moving left over a grey floor", "bob": "a blue ball moving up over a sand floor"}


def visitor(name: str, address: str) -> gr.Request:
    """What Gradio hands an event of one visitor: its session hash and its client's address."""
    return gr.Request(session_hash=name, client=type("Client", (), {"host": address})(), headers={})


@pytest.fixture(scope="module")
def hosted(tiny_model, tmp_path_factory):
    backend = Backend(loaded=tiny_model, hosted=True, output_dir=tmp_path_factory.mktemp("hosted_previews"),
                      allowed_local_dirs=(DEMO_ADAPTERS_DIR,))
    yield backend
    backend.binder.reset()
    backend.close()


def test_two_visitors_each_see_only_their_own_previews(hosted):
    events = GenerateEvents(hosted, RunningJobs())
    parts = GeneratePreview(preview="preview", preview_note="note")
    streamed: dict[str, list[dict[Any, Any]]] = {}
    boards: dict[str, PreviewBoard] = {}

    def run(name: str, request: Any) -> Any:  # what job_wiring's Generate event does, through the fair queue
        board = boards[name] = PreviewBoard()
        form = JobForm(new_session(), "unmerged", RequestForm(prompt=PROMPTS[name], seed=1, steps=4), "")
        views = events.generate_views(form, (), request, None, board)
        yield from streamed_reply("status", {f: f for f in ("video", "seed", "session")}, views,
                                  lambda now: generate_update(parts, board, now),
                                  lambda stopped: generate_finished(parts, board, stopped))

    held = []

    def visit(name: str, address: str) -> None:
        for update in admitted(run, hosted)(name, visitor(name, address)):
            held.append(hosted.admission.total)
            streamed.setdefault(name, []).append(update)

    threads = [threading.Thread(target=visit, args=(n, a)) for n, a in (("ann", "203.0.113.5"), ("bob", "198.51.100.7"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    for name, other in (("ann", "bob"), ("bob", "ann")):
        own = [p.image for p in boards[name].history()]
        shown = [update["preview"] for update in streamed[name]
                 if isinstance(update.get("preview"), np.ndarray)]  # each image once (SentImages), then skipped
        assert len(own) == 3 and shown, name
        assert all(any(image is mine for mine in own) for image in shown)  # every picture shown is its own
        theirs = [p.image for p in boards[other].history()]
        assert not any(np.array_equal(image, them) for image in shown for them in theirs)
        assert streamed[name][-1]["note"].startswith("Step 3 of 3") and streamed[name][-1]["status"] == ""
    assert max(held) == 2 and hosted.admission.total == 0  # both held in the fair queue at once, then released


def _put(board: PreviewBoard, column: str, step: int, count: int = 4) -> None:
    board.put(Preview(column, step, count, np.full((2, 2, 3), step, np.uint8), "vae", False, 0.0, 1.0))


def test_the_check_line_names_the_one_step_shown_and_what_has_not_started():
    board = PreviewBoard()
    for step in (1, 2, 3, 4):
        _put(board, "fallback", step)
    _put(board, "A", 1)
    assert check_line(board) == "A · fallback (alpha = rank) at step 1 of 4 (B not started)"
    parts = CheckPreviews("a", "b", "fallback", "note")
    stopped = check_finished(parts, board, stopped=True)
    assert stopped["note"] == "**Stopped**: the last previews stay shown (the status line says where)."
    assert check_stopped_where(board) == "A after 1 of 4, fallback (alpha = rank) after 4 of 4 steps; B not started"
    assert check_stopped_where(PreviewBoard()) == ""  # before any preview: the whole check's count stays
    assert stopped["a"][0, 0, 0] == 1 and stopped["fallback"][0, 0, 0] == 1  # both at A's step, as shown


def test_a_stopped_generation_keeps_its_last_preview():
    board, parts = PreviewBoard(), GeneratePreview("preview", "note")
    assert generate_update(parts, board, Progress(phase="queued", position=2)) == {
        "note": "Queued (position 2): previews start with the first step.", "preview": None}
    _put(board, "", 1)
    _put(board, "", 2)
    shown = generate_finished(parts, board, stopped=True)
    assert shown["note"] == "**Stopped after 2 of 4 steps**: the last preview stays shown."
    assert shown["preview"][0, 0, 0] == 2
