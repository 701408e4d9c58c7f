"""The request's predicted time before the click: the UI's line says the judge's prediction for the request as it
stands (hardware.estimate.TimeModel, given to the backend by app.py), nothing re-derived; a browser reads it."""

from __future__ import annotations

import re

import pytest
import torch
from app_fixtures import running_app
from playwright.sync_api import expect

from h3app.backend.service import Backend
from h3app.hardware.estimate import TimeModel, cpu_box, cpu_peaks, planned
from h3app.hardware.flavors import BY_NAME
from h3app.hardware.judge import Setup, judge
from h3app.hardware.planner import Placement
from h3app.model import repo
from h3app.request import GenerationRequest
from h3app.rules.frames import RELEASED
from h3app.ui.forms import RequestForm
from h3app.ui.generate.time_note import time_note, time_words
from h3app.ui.presenters import render

PREDICTION = {"step_s": 1.25, "evaluations": 29, "skipped": 7, "text_encoder_s": 0.2, "encode_s": 0.0,
              "decode_s": 3.5, "transfer_s": 0.0, "video_s": 31.9, "usd_per_video": 0.0123, "box": "h200 (H200)",
              "measured_rates": False}


class Limits:
    """The held model's checks, as the UI calls them (a canvas over 64×96 refused, like the tiny model's)."""

    frames = RELEASED

    @staticmethod
    def check_canvas(height, width):
        from h3app.errors import H3AppError

        if height and width and height * width > 6144:
            raise H3AppError("canvas too large")

    @staticmethod
    def check_steps(steps):
        pass


def test_the_note_asks_for_the_request_as_it_stands_and_says_its_answer():
    asked = []

    def predict(request):
        asked.append(request)
        return PREDICTION

    form = RequestForm(prompt="", steps=30, duration=6.0, height=64, width=96)
    text = time_note(form, Limits(), predict)
    (request,) = asked
    assert (request.steps, request.duration, request.height, request.width) == (30, 6.0, 64, 96)
    assert "**Predicted: 32 s**" in text and "$0.0123" in text and "h200 (H200)" in text
    assert "29 evaluations × 1.2 s (7 skipped by the step cache)" in text and "decode 3.5 s" in text


def test_refused_numbers_or_no_prediction_say_nothing():
    asked = []
    assert time_note(RequestForm(prompt="x", height=512, width=512), Limits(), asked.append) == ""
    assert time_note(RequestForm(prompt="x", duration=99), Limits(), asked.append) == ""
    assert asked == []  # refused before the time model is asked
    assert time_note(RequestForm(prompt="x"), Limits(), lambda request: None) == ""
    assert "$" not in time_words({**PREDICTION, "usd_per_video": None})


def test_a_run_records_the_prediction_it_was_shown_beside_its_seconds(tiny_model, tmp_path):
    backend = Backend(loaded=tiny_model, output_dir=tmp_path)
    backend.time_model = lambda request: {**PREDICTION, "video_s": 1.5} if request.steps == 2 else None
    try:
        output = backend.generate(GenerationRequest(prompt="a fox", seed=1, steps=2), [], None)
    finally:
        backend.close()
    time = output.settings["time"]
    assert time == {"predicted_s": 1.5, "usd_per_video": PREDICTION["usd_per_video"], "box": PREDICTION["box"],
                    "seconds": round(output.result.seconds, 3)}
    assert output.to_json()["time"] == time
    assert "generated in" in render.result_html(output.to_json())
    assert "(predicted 1.5 s on h200 (H200))" in render.result_html(output.to_json())


def test_a_failing_prediction_is_logged_and_never_fails_the_run(tiny_model, tmp_path, caplog):
    backend = Backend(loaded=tiny_model, output_dir=tmp_path)

    def broken(request):
        raise RuntimeError("rehearsal broke")

    backend.time_model = broken
    try:
        assert backend.predicted_or_none(GenerationRequest(prompt="x", seed=1, steps=2)) is None
    finally:
        backend.close()
    assert "time prediction failed" in caplog.text and "rehearsal broke" in caplog.text


@pytest.fixture(scope="module")
def cpu_time_model():
    setup = Setup(model=repo.TINY, dtype=torch.float32)
    return TimeModel(repo.TINY, setup, Placement(), cpu_box(), cpu_peaks())


@pytest.mark.slow
def test_the_time_model_is_the_judges_prediction_for_that_request(cpu_time_model):
    request = GenerationRequest(prompt="x", seed=1, steps=30, cache="fbc")
    answer = cpu_time_model(request)
    model = cpu_time_model
    verdict = judge(planned(request, repo.TINY), model.placement, model.box, model.setup, peaks=model.peaks)
    assert {k: answer[k] for k in verdict.prediction} == verdict.prediction
    assert answer["evaluations"] == 29 and answer["skipped"] > 0 and answer["decode_s"] > 0
    fewer = cpu_time_model(GenerationRequest(prompt="x", seed=1, steps=5))
    assert fewer["evaluations"] == 4 and fewer["skipped"] == 0 and fewer["video_s"] < answer["video_s"]
    assert answer["usd_per_video"] is None and answer["measured_rates"]  # this CPU has no price


@pytest.mark.slow
def test_a_priced_flavor_is_predicted_from_its_spec_sheet_with_its_price(cpu_time_model):
    h200 = BY_NAME["h200"]
    on_gpu = TimeModel(repo.TINY, cpu_time_model.setup, Placement(), h200)  # spec-sheet peaks, no measured rates
    answer = on_gpu(GenerationRequest(prompt="x", seed=1, steps=5))
    assert answer["usd_per_video"] == round(answer["video_s"] / 3600 * h200.usd_per_hour, 4)
    assert not answer["measured_rates"] and answer["box"] == h200.label
    assert answer["step_s"] < cpu_time_model(GenerationRequest(prompt="x", seed=1, steps=5))["step_s"]


@pytest.mark.browser
@pytest.mark.slow
def test_the_predicted_time_is_on_the_page_before_generate(tiny_model, tmp_path_factory, cpu_time_model, browser):
    backend = Backend(loaded=tiny_model, output_dir=tmp_path_factory.mktemp("outputs"))
    backend.time_model = cpu_time_model
    expected = cpu_time_model(GenerationRequest(prompt="x", seed=1, steps=backend.defaults.steps))
    try:
        with running_app(backend) as url:  # its own app: a backend with a time model; the session's chromium
            page = browser.new_page()
            page.set_viewport_size({"width": 1400, "height": 1000})
            page.set_default_timeout(90_000)
            page.goto(url)
            note = page.locator("#predicted-time")
            expect(note).to_contain_text("Predicted:", timeout=90_000)
            shown = note.inner_text()
            assert f"{expected['evaluations']} evaluations" in shown and "this CPU" in shown
            assert re.search(r"Predicted: [\d.]+ (s|min)", shown)
            expect(page.locator("#generate")).to_be_visible()  # before any click: nothing has run
            assert backend.last_seconds_per_run is None
            page.close()
    finally:
        backend.close()
