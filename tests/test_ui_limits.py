"""Each control has the ends of the one rule that checks it, a value outside is refused in one line and never
clamped or rounded: ``rules.values.Bounds``, ``ui/unclamped.py``, the request note, the check's status, and every
number box and slider of the built app. No browser: the app is built, not launched."""

from __future__ import annotations

import re
from dataclasses import replace

import gradio as gr
import pytest

from h3app.errors import H3AppError
from h3app.rules.values import ALPHA, MAX_SEED, SCALE_SLIDER, STRENGTH, parse_alpha, parse_strength
from h3app.ui.compare.events import ComparisonEvents
from h3app.ui.forms import KEEP, CheckForm, RequestForm, SlotForm
from h3app.ui.generate.events import request_note, request_problem
from h3app.ui.generate.tab import NUMBER_FIELDS, bind_limits, build_request_controls
from h3app.ui.unclamped import UNCLAMPED_CLASS, unclamped


def test_the_parsers_check_the_bounds_the_controls_show():
    assert parse_alpha(ALPHA.high) == ALPHA.high
    for bad in (ALPHA.low, -1, ALPHA.high * 1.0001):
        with pytest.raises(H3AppError, match=r"> 0 \(at most 1e\+06\)"):
            parse_alpha(bad)
    assert parse_strength(STRENGTH.low) == STRENGTH.low and parse_strength(STRENGTH.high) == STRENGTH.high
    with pytest.raises(H3AppError, match="between -100 and 100"):
        parse_strength(STRENGTH.high + 0.1)


def test_the_scale_slider_refuses_past_its_ends_in_one_line():
    assert SlotForm(strength=SCALE_SLIDER.high).strength_value() == 4.0
    with pytest.raises(H3AppError) as refused:
        SlotForm(strength=5).strength_value()
    message = str(refused.value)
    assert "scale 5 is outside the Scale slider's range (between -2 and 4)" in message and "\n" not in message
    assert "not clamped" in message and "±100" in message
    with pytest.raises(H3AppError, match="between -100 and 100"):  # past every entry point's rule: its line
        SlotForm(strength=1e9).strength_value()


def test_unclamped_controls_pass_what_was_typed_even_in_a_session_copy():
    with gr.Blocks():
        number = unclamped(gr.Number(7, minimum=0, precision=0), 0, 10)
        slider = unclamped(gr.Slider(-2, 4, value=1), -2, 4)
    for control, low, high in ((number, 0, 10), (slider, -2, 4)):
        # Gradio rebuilds a session's copy from the constructor arguments when an event updates a property
        copy = type(control)(**{**control.constructor_args, "render": False})
        for each in (control, copy):
            assert each.preprocess(-1) == -1 and each.preprocess(7.5) == 7.5 and each.preprocess(None) is None
            assert (each.minimum, each.maximum) == (low, high) and UNCLAMPED_CLASS in each.elem_classes
    assert number.get_block_name() == "number" and slider.get_block_name() == "slider"  # Gradio's own on the page


@pytest.fixture(scope="module")
def limits(backend):
    return backend.limits


def test_the_request_controls_take_the_ends_of_their_rules(limits):
    with gr.Blocks():
        controls = bind_limits(build_request_controls(limits), limits)
    ends = {name: (getattr(controls, name).minimum, getattr(controls, name).maximum) for name in NUMBER_FIELDS}
    assert ends["seed"] == (0, MAX_SEED)
    assert ends["steps"] == (limits.min_steps, limits.max_steps)
    assert ends["duration"] == (limits.frames.shortest_seconds, limits.frames.longest_seconds)
    assert ends["height"] == ends["width"] == (0, limits.max_pixels // limits.canvas_multiple)
    assert all(UNCLAMPED_CLASS in getattr(controls, name).elem_classes for name in NUMBER_FIELDS)


GOOD = RequestForm(prompt="p", seed=7, steps=2, duration=5.0, height=16, width=16)


@pytest.mark.parametrize("field, value, words", [
    ("seed", -1, "seed must be between 0"), ("seed", 7.5, "seed must be a whole number, got 7.5"),
    ("steps", 1000, "steps must be a whole number between 2 and 200"), ("steps", 2.5, "got 2.5"),
    ("duration", 20, "duration must be between 5 and 14.375"), ("height", 12, "positive multiple of 8"),
    ("width", -16, "width must be at least 1"), ("width", 1e6, "pixels, more than this model generates"),
    ("shift", -1, "shift must be a positive number"), ("audio_shift", "x", "audio shift must be a number"),
])
def test_a_refused_request_number_is_said_under_the_numbers_never_rounded(limits, field, value, words):
    form = replace(GOOD, **{field: value})
    note = request_note(form, limits, None)
    assert note.startswith("**✖ Not applied:**") and words in note and "\n" not in note
    assert words in request_problem(form, limits)
    with pytest.raises(H3AppError, match=re.escape(words.split(",")[0])):  # a job is refused by the same rules
        limits.check_request(form.to_request(lenient=False))


def test_a_good_request_shows_what_its_steps_mean(limits):
    assert request_problem(GOOD, limits) is None
    assert request_note(GOOD, limits, None).startswith("**2 steps → 1 transformer evaluations**")


def test_the_check_boxes_refuse_in_the_status_and_keep_a_typed_pair():
    assert ComparisonEvents.check_values_note(CheckForm(8, 1, 128, 0.0625)) == ""
    assert "setting B: scale" in ComparisonEvents.check_values_note(CheckForm(8, 1, 128, 1e9))
    info = {"alpha": 1.0, "alpha_source": "registry", "rank": 16}
    first = ComparisonEvents.check_pair(info, False, "1")
    assert first.a_alpha == 1.0 and first.suggested == [1.0, 1.0, 16.0, 0.0625]
    again = ComparisonEvents.check_pair(info, False, "1", first.suggested)  # Gradio's repeated change events
    assert again.a_alpha is KEEP and again.b_scale is KEEP and again.pair_note == first.pair_note
    moved = ComparisonEvents.check_pair(info, True, "4", first.suggested)  # a new alpha in use: a new pair
    assert moved.a_alpha == 4.0


def test_every_box_and_slider_of_the_app_is_unclamped(backend):
    """Gradio's own bound check (a traceback in the log) and rounding never see a value typed on the page."""
    from h3app.ui.app_ui import build_app

    demo = build_app(backend)
    controls = [b for b in demo.blocks.values() if isinstance(b, (gr.Number, gr.Slider))]
    bounded = [b for b in controls if b.minimum is not None or b.maximum is not None or
               getattr(b, "precision", None) is not None]
    assert bounded and all(UNCLAMPED_CLASS in (b.elem_classes or []) for b in bounded), [
        (b.label, type(b).__name__) for b in bounded if UNCLAMPED_CLASS not in (b.elem_classes or [])]
