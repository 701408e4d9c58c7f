"""The request's predicted time (and $) before the click: the plan's prediction on this box, in words.

The number is the backend's (``Backend.predicted_time``: the judge's ``video_s`` and its terms, ``hardware.estimate``
given by ``app.py``); this module only says it. Shown under the request's numbers, for Generate; Equivalence and
Grid run that request several times (their buttons say how many).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ...backend.limits import Limits
from ...errors import H3AppError
from ..forms import RequestForm

TIME_NOTE_ID = "predicted-time"


def predicted_for(form: RequestForm, limits: Limits,
                  predict: Callable[[Any], Mapping[str, Any] | None]) -> Mapping[str, Any] | None:
    """``predict``'s answer for the request ``form`` stands for (the prompt does not change the time), or None when
    its numbers are refused (``request_note`` says why) or there is no prediction."""
    try:
        request = replace(form, prompt="-", randomize=False).to_request()
        limits.check_canvas(request.height, request.width)
        limits.check_steps(request.steps)
        limits.frames.check_duration(request.duration)
    except H3AppError:
        return None
    return predict(request)


def seconds_words(seconds: float) -> str:
    """``0.64 s``, ``42 s``, ``3 min 5 s``."""
    if seconds < 10:
        return f"{seconds:.2g} s" if seconds < 1 else f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


def time_words(prediction: Mapping[str, Any] | None) -> str:
    """The line under the request: ``**Predicted: 42 s** per video on h200 (…) · $0.012 — 29 evaluations × 1.2 s +
    decode 3.1 s …``; '' without a prediction."""
    if not prediction:
        return ""
    parts = [f"{prediction['evaluations']} evaluations × {seconds_words(prediction['step_s'])}"]
    if prediction.get("skipped"):
        parts[0] += f" ({prediction['skipped']} skipped by the step cache)"
    for key, name in (("text_encoder_s", "text encoder"), ("encode_s", "encode"), ("decode_s", "decode"),
                      ("transfer_s", "offload transfers")):
        if prediction.get(key):
            parts.append(f"{name} {seconds_words(prediction[key])}")
    usd = prediction.get("usd_per_video")
    price = f" · **${usd:.4f}** per video" if usd is not None else ""
    text = (f"⏱ **Predicted: {seconds_words(prediction['video_s'])}** per video on {prediction['box']}{price} — "
            f"{' + '.join(parts)}.")
    if prediction.get("zerogpu"):  # ZeroGPU: the backend's declared duration for this request (backend/zero_gpu.py)
        text += zero_gpu_words(prediction["zerogpu"])
    if prediction.get("measured_rates"):
        text += ("  \n<small>The plan's time model at rates measured on this CPU at start-up (a matmul, a copy, the "
                 "cost of one small op); other work on this machine slows the run, and the rates, alike.</small>")
    return text


def zero_gpu_words(call: Mapping[str, Any]) -> str:
    """``  \n🎟 uses about N s of your ZeroGPU quota`` (the quota the call asks for), or the per-call cap it is over."""
    if call["quota_s"] > call["cap_s"]:
        return (f"  \n🎟 **Over ZeroGPU's per-call cap**: this request would ask for {call['quota_s']} s of quota (at most "
                f"{call['cap_s']} s a call): use fewer steps, a shorter clip or a Turbo preset (4 steps).")
    return (f"  \n🎟 **uses about {call['charged_s']} s of your ZeroGPU quota** (the whole card counts twice; the "
            f"call asks for {call['quota_s']} s, so that much must be left).")


def time_note(form: RequestForm, limits: Limits, predict: Callable[[Any], Mapping[str, Any] | None]) -> str:
    """The event: the request's predicted time in words ('' when refused or unknown)."""
    return time_words(predicted_for(form, limits, predict))
