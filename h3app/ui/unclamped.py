"""Number boxes and sliders that show the limits of the rule that checks them and never clamp.

Gradio does two things with a value outside a control's ``minimum``/``maximum`` that would hide it from the person:

- the server side of ``gr.Number`` and ``gr.Slider`` (``preprocess``) raises its own ``Error`` ("Value 1e9 is greater
  than maximum value 4.") — with a traceback in the server log — and rounds to ``precision`` (a seed of 7.5 becomes
  8);
- the page's slider clamps a value typed into its number box when the box loses focus (1e9 becomes 4, silently).

:func:`unclamped` keeps the limits on the control (its ends and the number box's ``min``/``max``) and hands the
value to the app exactly as typed; the rule (``rules.values``, ``backend.limits``, ``GenerationRequest``) then
refuses it in one line where the person is looking. :data:`NO_CLAMP_JS` (given to ``launch(js=…)``) stops the blur
that clamps, for the controls marked :data:`UNCLAMPED_CLASS` only. Both lean on how Gradio 6 behaves (checked by
the browser tests that type out-of-range values); the Gradio version they were checked on is the Gradio door's
(``gradio_compat.WRITTEN_FOR``, refused at start-up on another). Only public extension points are used: a subclass
overriding ``preprocess``, ``is_template`` and ``constructor_args``.
"""

from __future__ import annotations

from typing import Any, TypeVar

import gradio as gr

from . import gradio_compat  # noqa: F401 - the version check: the behaviour worked around is gradio 6.31.0's

UNCLAMPED_CLASS = "h3-unclamped"

Control = TypeVar("Control", gr.Number, gr.Slider)

# Runs once when the page loads. Capture phase: it sees the blur before the slider's own listener on its number box
# and stops it there, so the typed value stays (the value already reached the app on "input").
NO_CLAMP_JS = f"""
() => {{
  document.addEventListener("blur", (event) => {{
    const box = event.target;
    if (box instanceof HTMLInputElement && box.type === "number" && box.closest(".{UNCLAMPED_CLASS}")) {{
      event.stopImmediatePropagation();
    }}
  }}, true);
}}
"""


class _UnclampedNumber(gr.Number):
    """``gr.Number`` whose typed value reaches the app as typed. ``is_template``: the page draws it as Gradio's own
    Number (Gradio's public mechanism for template components such as ``gr.Text``)."""

    is_template = True

    def preprocess(self, payload: Any) -> Any:
        return payload


class _UnclampedSlider(gr.Slider):
    """``gr.Slider`` whose typed value reaches the app as typed (drawn as Gradio's own Slider)."""

    is_template = True

    def preprocess(self, payload: Any) -> Any:
        return payload


def unclamped(control: Control, low: float | None = None, high: float | None = None) -> Control:
    """``control`` with ``low``/``high`` as its ends (None: unchanged) whose typed value reaches the app as typed:
    no bound check, no rounding, no clamp on the page.

    It takes the class of its unclamped twin and records the ends in its constructor arguments, because Gradio
    rebuilds a session's copy of a component from those (``type(block)(**block.constructor_args)``) whenever an
    event updates one of its properties; the copy must keep both."""
    for name, value in (("minimum", low), ("maximum", high)):
        if value is not None:
            setattr(control, name, value)
            control.constructor_args[name] = value
    classes: list[str] | str = control.elem_classes or []
    control.elem_classes = [*([classes] if isinstance(classes, str) else classes), UNCLAMPED_CLASS]
    control.constructor_args["elem_classes"] = control.elem_classes
    if type(control) is gr.Number:  # the twin of exactly Gradio's class (a subclass keeps its own)
        control.__class__ = _UnclampedNumber
    elif type(control) is gr.Slider:
        control.__class__ = _UnclampedSlider
    return control
