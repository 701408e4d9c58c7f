"""The limits a box holds (``judge.limits``): the longest clip a placement fits, found on real verdicts; what the
app hands its UI and API (``Backend.hold_to``); and the linearity in frames the search leans on."""

from __future__ import annotations

from dataclasses import replace

import gradio as gr
import pytest
from test_hardware_plan import _measured

from h3app.errors import H3AppError
from h3app.hardware import judge as judge_module
from h3app.hardware.flavors import GB, Flavor
from h3app.hardware.judge import Setup, default_request, frame_grid, judge, limits, measured_for
from h3app.hardware.planner import Placement
from h3app.rules.frames import RELEASED

REQUEST = default_request()


def _growing(curve):
    """A stand-in for ``measured_for`` whose denoising transient is ``curve(frames)`` bytes; records each call."""
    calls: list[int] = []

    def measured(request, setup):
        calls.append(request.frames)
        fixture = _measured()
        phase = fixture.rehearsal.phases["denoise"]
        fixture.rehearsal.phases["denoise"] = replace(phase, peak=phase.start + int(curve(request.frames)))
        return fixture

    return measured, calls


CURVES = {
    "linear": lambda frames: 0.06 * GB * frames,
    "convex": lambda frames: 0.0004 * GB * frames ** 2,
    "concave": lambda frames: 1.2 * GB * frames ** 0.5,
}


@pytest.mark.parametrize("curve", CURVES)
@pytest.mark.parametrize("gpu_gb", [80, 84, 88, 92, 96, 100, 200])
def test_limits_are_the_longest_clip_that_fits_whatever_the_growth(monkeypatch, curve, gpu_gb):
    """Brute force over every clip length against the search: the same answer, and every length reported was
    judged on its own measurement (the search only chooses which lengths to measure)."""
    measured, calls = _growing(CURVES[curve])
    monkeypatch.setattr(judge_module, "measured_for", measured)
    box = Flavor("box", "H200", 1, gpu_gb * GB, 512 * GB, None, None, None)
    placement = Placement("auto")
    fitting = [f for f in frame_grid(REQUEST.frames, RELEASED.max_frames)
               if judge(replace(REQUEST, frames=f), placement, box).fits]
    calls.clear()
    held = limits(REQUEST, placement, box)
    if not fitting or fitting[0] != REQUEST.frames:
        assert held is None
        return
    assert held["max_frames"] == fitting[-1] and held["max_duration_s"] == pytest.approx(fitting[-1] / RELEASED.fps)
    assert (held["height"], held["width"], held["max_pixels"]) == (768, 1344, 768 * 1344)
    assert held["max_frames"] in calls  # the limit itself was measured
    if fitting[-1] != RELEASED.max_frames:
        above = frame_grid(REQUEST.frames, RELEASED.max_frames)[len(fitting)]
        assert above in calls  # and so was the next length, which does not fit
    if curve == "linear":
        assert len(set(calls)) <= 4  # the request, the longest clip, the limit and the one above


def test_a_box_the_request_does_not_fit_has_no_limits(monkeypatch):
    measured, _ = _growing(CURVES["linear"])
    monkeypatch.setattr(judge_module, "measured_for", measured)
    assert limits(REQUEST, Placement("none"), Flavor("small", "L4", 1, 24 * GB, 30 * GB, None, None, None)) is None


def test_the_app_holds_its_ui_and_api_to_the_box_limits(tiny_model):
    """What app.py does with the judge's limits: the duration slider ends there, and a longer request is refused
    by the backend (API and CLI alike) before it is queued."""
    from h3app.backend.service import Backend
    from h3app.request import GenerationRequest
    from h3app.ui.generate.tab import build_request_controls

    backend = Backend(loaded=tiny_model)
    try:
        model_longest = backend.limits.frames.longest_seconds
        held = {"max_frames": 226, "max_duration_s": 226 / RELEASED.fps, "max_pixels": 64 * 64}
        backend.hold_to(max_seconds=held["max_duration_s"], max_pixels=held["max_pixels"])
        assert backend.limits.frames.max_frames == 226 < RELEASED.max_frames
        assert backend.limits.frames.longest_seconds == pytest.approx(held["max_duration_s"])
        assert held["max_duration_s"] < model_longest
        with gr.Blocks():
            controls = build_request_controls(backend.limits, backend.defaults)
        assert controls.duration.maximum == pytest.approx(held["max_duration_s"])
        assert controls.duration.value == backend.defaults.duration <= controls.duration.maximum
        with pytest.raises(H3AppError, match="duration must be between"):
            backend.check_request(GenerationRequest(prompt="x", duration=12.0))
        with pytest.raises(H3AppError, match="pixels"):
            backend.check_request(GenerationRequest(prompt="x", height=64, width=96))
        backend.check_request(GenerationRequest(prompt="x", duration=9.0, height=64, width=64))
        backend.hold_to(max_seconds=99.0, max_pixels=10**9)  # never beyond the model's own
        assert backend.limits.frames.max_frames == 226 and backend.limits.max_pixels == 64 * 64
    finally:
        backend.close()


@pytest.mark.slow
def test_every_phase_grows_linearly_with_the_clip_on_real_rehearsals():
    """The search interpolates between two judged lengths: on the tiny checkpoint's rehearsals at three lengths,
    each phase's transient and the host peak lie on one line (within 1 %)."""
    tiny = default_request("tiny")
    short, middle, long = (measured_for(replace(tiny, frames=f), Setup(model="tiny")).rehearsal for f in
                           (124, 226, 345))
    share = (226 - 124) / (345 - 124)
    for name in ("denoise", "vae_decode", "audio_vae_decode"):
        low, mid, high = (r.phases[name].transient for r in (short, middle, long))
        assert high > low and mid == pytest.approx(low + share * (high - low), rel=0.01), name
    assert middle.host_peak == pytest.approx(short.host_peak + share * (long.host_peak - short.host_peak), rel=0.01)
