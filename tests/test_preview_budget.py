"""Previews that cost what they show (docs/ui.md, "Step previews"): a board with a budget thins its previews so that
they take at most that share of the run's denoising time (plus the first, which measures their cost); without one
(the CLI's --preview) every evaluation is previewed; the page's "Step preview" toggle off decodes none. The speed
itself is measured in bench/page_generate.py (page Generate over /generate), never asserted here."""

from __future__ import annotations

import numpy as np
import pytest

from h3app.backend.generation import run_generation
from h3app.backend.preview import Preview, PreviewBoard
from h3app.request import GenerationRequest
from h3app.ui.forms import JobForm, RequestForm
from h3app.ui.generate.events import GenerateEvents
from h3app.ui.generate.preview_stream import (
    PAGE_PREVIEW_BUDGET,
    PREVIEW_OFF,
    WAITING,
    GeneratePreview,
    generate_finished,
    preview_toggled,
)
from h3app.ui.session import RunningJobs, new_session

PROMPT = "a red ball moving right over a grey floor, low soft hum"


def test_a_budget_lets_through_the_first_preview_then_what_fits():
    board = PreviewBoard(budget=0.1)
    assert board.wants(spent=0.0, cost=0.0, denoised=0.01)  # the first: its cost is not known yet
    assert not board.wants(spent=0.2, cost=0.2, denoised=1.0)  # 0.4 s of previews in 1 s of steps: over 10 %
    assert board.wants(spent=0.2, cost=0.2, denoised=4.0)  # 0.4 s in 4 s: within
    assert PreviewBoard().wants(spent=9.0, cost=9.0, denoised=1.0)  # no budget: every evaluation


@pytest.mark.slow
def test_a_tiny_run_thins_its_previews_to_the_budget_and_the_cli_keeps_every_step(tiny_model):
    pipe = tiny_model.pipeline("t2va")
    request = GenerationRequest(prompt=PROMPT, seed=1, steps=21, height=16, width=16)
    every, thinned = PreviewBoard(), PreviewBoard(budget=PAGE_PREVIEW_BUDGET)
    run_generation(pipe, request, listeners=(every.listener(pipe),))
    result = run_generation(pipe, request, listeners=(thinned.listener(pipe),))
    assert [p.step for p in every.history()] == list(range(1, result.evaluations + 1))
    kept = thinned.history()
    assert kept[0].step == 1 and len(kept) + thinned.thinned == result.evaluations
    # what the kept previews cost: within the budget of the denoising time, plus the one that measured the cost
    spent = sum(p.seconds for p in kept)
    denoised = sum(p.step_seconds for p in every.history())  # the same run's evaluations, every one timed
    if kept[0].seconds > PAGE_PREVIEW_BUDGET * kept[0].step_seconds:  # a preview costs more than its share here
        assert thinned.thinned > 0
    assert spent - kept[0].seconds <= PAGE_PREVIEW_BUDGET * denoised * 2  # loose: two runs on a busy machine


@pytest.mark.slow
def test_the_step_preview_toggle_off_decodes_nothing(backend):
    events = GenerateEvents(backend, RunningJobs())
    form = JobForm(new_session(), "unmerged", RequestForm(prompt=PROMPT, seed=1, steps=3, height=16, width=16), "")
    for on in (True, False):
        board = PreviewBoard(budget=PAGE_PREVIEW_BUDGET)
        *_, view = events.generate_views(form, (), None, None, board, on)
        assert view.video and (len(board.history()) > 0) is on, (on, view, board.notes())
    assert preview_toggled(False) == PREVIEW_OFF and preview_toggled(True) == WAITING


def _put(board: PreviewBoard, step: int, count: int) -> None:
    board.put(Preview("", step, count, np.zeros((2, 2, 3), np.uint8), "vae", False, 0.2, 0.1))


def test_a_thinned_run_says_where_its_last_preview_is():
    board, parts = PreviewBoard(), GeneratePreview("preview", "note")
    _put(board, 1, count=79)
    shown = generate_finished(parts, board, stopped=False)
    assert shown["note"].startswith("Last preview at step 1 of 79: on this model a preview costs 2.0 steps")
    _put(board, 79, count=79)
    assert generate_finished(parts, board, stopped=False)["note"].startswith("Step 79 of 79")
