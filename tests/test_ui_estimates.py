"""One estimator for every time the page states (docs/ui.md, "One estimator"): Generate's line, the check's cost and
the Grid's come from one estimate of the request; a run at a size is what the next estimate at that size says; other
sizes get the time model corrected by this server's runs; fl2va and ref2va are estimated before their inputs are
uploaded. How close an estimate comes to the run it then makes is measured in bench/page_generate.py (P6), never
asserted here."""

from __future__ import annotations

import pytest

from h3app.request import GenerationRequest
from h3app.ui.compare.events import ComparisonEvents
from h3app.ui.forms import GridForm, JobForm, RequestForm
from h3app.ui.generate.estimates import Estimator, RequestSize, estimate_lines, estimator_for, sized
from h3app.ui.generate.events import GenerateEvents
from h3app.ui.generate.time_note import seconds_words
from h3app.ui.session import RunningJobs, new_session

PROMPT = "a red ball moving right over a grey floor, low soft hum"


def predicted(size) -> dict:
    """A time model: 1 s fixed + 0.5 s per evaluation, whatever the canvas (the tiny model's plans its largest)."""
    return {"video_s": 1.0 + 0.5 * (int(size.steps) - 1), "step_s": 0.5, "evaluations": int(size.steps) - 1,
            "box": "this CPU"}


def size(steps: int = 5, height: int | None = None, workflow: str = "t2va") -> RequestSize:
    return RequestSize(workflow, height, height and height * 2, 5.0, steps, "none")


def test_before_any_run_the_time_model_speaks_then_the_runs_of_this_server():
    estimator = Estimator(predicted)
    first = estimator.estimate(size())
    assert first.seconds == 3.0 and first.source.startswith("the time model (no run")
    estimator.learn(GenerationRequest(prompt=PROMPT, steps=5), 0.6)  # this machine: 5× faster than predicted
    same = estimator.estimate(size())
    assert same.seconds == pytest.approx(0.6) and same.source.startswith("measured here")
    more_steps = estimator.estimate(size(steps=9))  # same size, more steps: scaled by the time model's ratio
    assert more_steps.seconds == pytest.approx(0.6 * 5.0 / 3.0)
    other = estimator.estimate(size(height=16))  # another canvas: the time model × measured ÷ predicted
    assert other.seconds == pytest.approx(3.0 * 0.2) and "× 0.2" in other.source


def test_without_a_time_model_a_run_still_speaks_and_nothing_is_invented():
    estimator = Estimator(lambda size: None)
    assert estimator.estimate(size()) is None
    estimator.learn(GenerationRequest(prompt=PROMPT, steps=5), 2.0)
    assert estimator.estimate(size(steps=9)).seconds == pytest.approx(2.0 * 9 / 5)  # evaluations + the decode
    assert estimator.estimate(size(height=16)) is None


def test_keyframe_and_reference_workflows_are_estimated_before_their_inputs(backend):
    for workflow in ("fl2va", "ref2va"):
        found = sized(RequestForm(workflow=workflow, prompt="", steps=5), backend.limits)
        assert found is not None and found.workflow == workflow
    assert sized(RequestForm(steps=0), backend.limits) is None  # refused numbers: no estimate, the note says why


@pytest.fixture
def timed_backend(backend):
    """The module's backend with a time model (app.py gives the app one; tests' backends have none)."""
    was = backend.time_model
    backend.time_model = predicted
    try:
        yield backend
    finally:
        backend.time_model = was


def test_generate_check_and_grid_say_one_estimate_and_a_run_at_a_size_is_the_next_estimate(timed_backend):
    events, comparisons = GenerateEvents(timed_backend, RunningJobs()), ComparisonEvents(timed_backend, RunningJobs())
    form = RequestForm(prompt=PROMPT, seed=3, steps=3, height=16, width=16, workflow="fl2va")
    grid = GridForm("1, 16", "0.0625, 1", "7")
    before = estimate_lines(timed_backend, comparisons, form, grid)
    assert all(before.values()), before  # fl2va, nothing uploaded: every line has its estimate
    assert "Predicted: 2.0 s" in before["generate"] and "about **" in before["check"] and "about **" in before["grid"]
    run = events.generate_view(JobForm(new_session(), "unmerged", RequestForm(prompt=PROMPT, seed=3, steps=3,
                                                                             height=16, width=16)), progress=None)
    seconds = run.settings_json["result"]["seconds"]
    after = estimate_lines(timed_backend, comparisons, RequestForm(prompt=PROMPT, steps=3, height=16, width=16), grid)
    each = seconds_words(estimator_for(timed_backend).estimate(size(steps=3, height=16)).seconds)
    assert f"About {each}" in after["generate"] and "measured here" in after["generate"]
    assert f"({each} per generation" in after["check"] and f"({each} per generation" in after["grid"]
    assert "5 generations" in after["grid"]  # 4 cells + 1 baseline
    assert estimator_for(timed_backend).estimate(size(steps=3, height=16)).seconds == pytest.approx(seconds, rel=0.01)
