"""One source of limits: the request controls offer exactly what the pipeline accepts (read from the pipeline, the
17n+5 frame rule at its fps included), and every refused value reaches an API client as one line, never a 500."""

from __future__ import annotations

import json

import gradio as gr
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from h3app.backend.generation import run_generation
from h3app.backend.limits import model_limits
from h3app.errors import H3AppError
from h3app.request import GenerationRequest
from h3app.rules.frames import RELEASED
from h3app.ui.generate.tab import build_request_controls

TURBO = "assets/adapters/tiny_turbo_4step.safetensors"


def test_the_released_frame_rule_is_the_pipelines(tiny_model):
    """What the CLI says before a model is loaded (``RELEASED``) is what the loaded pipeline enforces."""
    limits = model_limits(tiny_model.pipeline("t2va"))
    assert limits.frames == RELEASED
    assert (limits.frames.max_frames, limits.frames.longest_seconds) == (345, 14.375)  # 17 × 20 + 5 frames at 24 fps


def test_every_duration_the_rule_accepts_is_accepted_by_the_pipelines_own_check(tiny_model):
    """The rule's range is exactly the pipeline's: its ends and every 3-frame step between pass diffusers' own
    frame check, one frame past the top does not (the check diffusers runs, on the aligned count)."""
    pipe = tiny_model.pipeline("t2va")
    rule = model_limits(pipe).frames

    def pipeline_accepts(duration: float) -> bool:
        from diffusers.modular_pipelines.minimax_h3.modular_pipeline import align_num_frames

        aligned = align_num_frames(rule.requested_frames(duration), pipe.vae_frames_per_chunk,
                                   pipe.vae_latents_per_chunk)
        return pipe.min_duration <= aligned / pipe.fps <= pipe.max_duration

    offered = [rule.shortest_seconds + i * 3 / rule.fps for i in range(int((rule.longest_seconds - 5) * 8) + 1)]
    assert offered[-1] == rule.longest_seconds and all(pipeline_accepts(d) for d in offered)
    assert not pipeline_accepts(rule.longest_seconds + 1 / rule.fps)
    for refused in (15.0, 14.9, 14.5, 4.9):
        with pytest.raises(H3AppError, match=r"between 5 and 14\.375 seconds"):
            rule.check_duration(refused)


@pytest.mark.slow
def test_each_request_slider_at_both_ends_runs(tiny_model):
    """The Steps and Duration sliders at their ends (and the smallest canvas the Height/Width boxes step to) are
    accepted by the backend's checks and by the pipeline itself."""
    limits = model_limits(tiny_model.pipeline("t2va"))
    with gr.Blocks():
        controls = build_request_controls(limits)
    steps, duration = controls.steps, controls.duration
    assert (duration.minimum, duration.maximum) == (limits.frames.shortest_seconds, limits.frames.longest_seconds)
    assert ((duration.maximum - duration.minimum) / duration.step).is_integer()  # the top is on the slider's grid
    side = controls.height.step
    ends = [(steps.minimum, duration.maximum), (steps.maximum, duration.minimum)]
    for step_count, seconds in ends:
        request = GenerationRequest(prompt="a red ball", steps=int(step_count), duration=seconds, height=side,
                                    width=side)
        limits.check_request(request)
        result = run_generation(tiny_model.pipeline("t2va"), request)
        assert result.frames == limits.frames.frames(seconds)
    assert ends[0][1] == 14.375 and result.fps == limits.frames.fps


# ------------------------------------------------------------------------------------------------------- the API
REFUSED_GENERATE = [
    ({"duration": 15.0}, "duration"), ({"duration": 14.9}, "duration"), ({"duration": 4.9}, "duration"),
    ({"steps": 1}, "steps"), ({"steps": 201}, "steps"), ({"steps": 2.5}, "steps"),
    ({"height": 12, "width": 16}, "height"), ({"height": 16, "width": 0}, "both"),
    ({"adapters_json": json.dumps([{"source": TURBO, "alpha": "eight"}])}, "alpha"),
    ({"adapters_json": json.dumps([{"source": TURBO, "alpha": 1e9}])}, "alpha"),
    ({"adapters_json": json.dumps([{"source": TURBO, "scale": -200}])}, "scale"),
]
REFUSED_LOAD = [({"alpha": "eight"}, "alpha"), ({"alpha": "1e9"}, "alpha"), ({"alpha": "-1"}, "alpha"),
                ({"alpha": "nan"}, "alpha"), ({"scale": -200.0}, "scale")]


@pytest.fixture(scope="module")
def client(app, tmp_path_factory):
    """A client of the session's app (tests/browser_fixtures.py)."""
    client = Client(app[0], download_files=str(tmp_path_factory.mktemp("downloads")), verbose=False)
    yield client
    client.close()


def one_line_refusal(call) -> str:
    with pytest.raises(AppError) as refused:
        call()
    message = str(refused.value).strip()
    assert "\n" not in message and "Traceback" not in message and "500" not in message, message
    return message


@pytest.mark.slow
@pytest.mark.parametrize("change,word", REFUSED_GENERATE, ids=[str(c) for c, _ in REFUSED_GENERATE])
def test_a_refused_request_value_is_one_line_from_the_api(client, change, word):
    fields = {"prompt": "a red ball", "seed": 0, "steps": 2, "duration": 5.0, "height": 16, "width": 16,
              "adapters_json": "[]", **change}
    assert word in one_line_refusal(lambda: client.predict(**fields, api_name="/generate"))


@pytest.mark.slow
@pytest.mark.parametrize("change,word", REFUSED_LOAD, ids=[str(c) for c, _ in REFUSED_LOAD])
def test_a_refused_adapter_value_is_one_line_from_the_api(client, change, word):
    fields = {"slot": 1, "source": TURBO, "alpha": "auto", "scale": 1.0, **change}
    assert word in one_line_refusal(lambda: client.predict(**fields, api_name="/load"))
