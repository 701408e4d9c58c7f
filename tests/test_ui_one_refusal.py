"""A refused value is said once, where the person looks, and goes when it is fixed (docs/ui.md, "One line per
problem"): steps 0 → Generate → steps 5, and alpha 1e9 → Generate, through the built app's own event functions
(no browser): the click stops without a pop-up, its status line points to the value's own line, and the next change
of an input clears it."""

from __future__ import annotations

import gradio as gr
import pytest

from h3app.ui.generate.events import NOT_RUN, stale_refusals


def _by_id(demo) -> dict[str, object]:
    return {block.elem_id: block for block in demo.blocks.values() if getattr(block, "elem_id", None)}


def _events(demo, component, event: str) -> list:
    """The app's event functions triggered by ``component``'s ``event``, in the order they were added."""
    return [fn for fn in demo.fns.values() if any(t[0] is not None and t[0] == component._id and t[1] == event
                                                  for t in fn.targets)]


def _values(demo, fn, changed: dict) -> dict:
    """``fn``'s inputs as the page would send them: each component's value, ``changed`` replacing some."""
    return {block: changed.get(block, getattr(block, "value", None)) for block in fn.inputs}


def _call(demo, fn, changed: dict):
    """Run event ``fn`` as Gradio would with those inputs: one dict for an event of a set of inputs, else positional
    (an ordered event's first input is the page's number: none here, as from a client without the page's script)."""
    values = _values(demo, fn, changed)
    return fn.fn(values) if fn.inputs_as_dict else fn.fn(*values.values())


@pytest.fixture(scope="module")
def built_app(backend):
    from h3app.ui.app_ui import build_app

    demo = build_app(backend)
    return demo, _by_id(demo)


def _click_generate(demo, found, changed: dict) -> str:
    """Generate's click with ``changed`` controls: the queued sync must refuse without a pop-up; returns the status
    line its failure handler writes."""
    sync, *_ = _events(demo, found["generate"], "click")
    with pytest.raises(gr.Error) as refused:
        _call(demo, sync, changed)
    assert refused.value.visible is False  # no pop-up: the page says it once
    failure = next(fn for fn in demo.fns.values() if fn.trigger_only_on_failure and fn.trigger_after == sync._id)
    (line,) = _call(demo, failure, changed).values()  # {status: line}: it answers in the page's order
    return line


def _changed(demo, component, changed: dict) -> dict:
    """What the one redraw event of ``component.change`` writes, keyed by elem_id."""
    (redraw,) = [fn for fn in _events(demo, component, "change") if fn.trigger_mode == "always_last"
                 and fn.queue is False]
    shown = _call(demo, redraw, changed)
    return {getattr(block, "elem_id", None): value for block, value in shown.items()}


def test_steps_0_is_said_under_steps_once_and_goes_when_fixed(built_app):
    demo, found = built_app
    steps, status = found["steps"], found["generate-status"]
    note = _changed(demo, steps, {steps: 0})["request-note"]
    assert "✖ Not applied" in note and "steps" in note
    line = _click_generate(demo, found, {steps: 0})
    assert line == f"{NOT_RUN}: a request value is refused (the note under Steps says why)."
    assert "steps must" not in line  # a pointer, not a second copy
    after = _changed(demo, steps, {steps: 5, status: line})
    assert after["generate-status"] == "" and "✖" not in after["request-note"]
    assert _changed(demo, steps, {steps: 5, status: "**Cancelled after 2 of 4 steps**"}).get("generate-status") is None


def test_alpha_1e9_is_said_in_the_alpha_card_once_and_goes_when_fixed(built_app):
    demo, found = built_app
    source, alpha, override, status = (found["slot1-source"], found["slot1-alpha"], found["slot1-override"],
                                       found["generate-status"])
    bad = {source: "assets/adapters/tiny_turbo_4step.safetensors", alpha: "1e9", override: True}
    shown = _changed(demo, alpha, bad)
    sentence = "alpha must be"
    copies = [key for key, value in shown.items() if sentence in str(value)]
    assert copies == ["slot1-alpha-card"], copies  # the readout and the line above Generate point to it
    assert "the alpha card says why" in shown["apply-note"]
    line = _click_generate(demo, found, bad)
    assert line == f"{NOT_RUN}: the line above says why."
    fixed = _changed(demo, alpha, {**bad, alpha: "8", status: line})
    assert fixed["generate-status"] == "" and sentence not in str(fixed["slot1-alpha-card"])


def test_only_a_jobs_refusal_is_cleared():
    with gr.Blocks():
        a, b, c = gr.Markdown(), gr.Markdown(), gr.Markdown()
    cleared = stale_refusals({a: f"{NOT_RUN}: x", b: "Done: 4 cells", c: None})
    assert cleared == {a: ""}


def test_every_redraw_answers_in_a_form_gradio_takes(built_app):
    """A redraw with nothing to change (a refusal to clear where there is none) answers ``gr.skip()``, never an
    empty dict (Gradio reads that as one output's value and the page shows an error)."""
    demo, _ = built_app
    redraws = [fn for fn in demo.fns.values() if fn.trigger_mode == "always_last" and fn.queue is False and fn.fn]
    assert len(redraws) > 20
    for fn in redraws:
        shown = _call(demo, fn, {})
        if isinstance(shown, dict) and shown.get("__type__") != "update":  # gr.skip() is an update
            assert shown and set(shown) <= set(fn.outputs), (fn.name, shown)
