"""The advanced strengths as the named endpoints' parameters, derived from the settings schema
(``h3app.settings.KNOBS``): one hidden input, one label, one docstring line and one named parameter per knob.

``/load`` and ``/set_lora`` are written with ``*advanced`` as their last positional parameters; :func:`flattened`
gives Gradio (which reads an event function's signature for its API page and for where to put ``gr.Request`` and
``gr.Progress``) one named parameter per knob in their place, so a new knob reaches the API with no edit here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import gradio as gr

from ...settings import FACTOR, KNOBS, Knob

_Param = inspect.Parameter


def api_label(knob: Knob) -> str:
    """The words beside the knob's parameter on the API page (``SCALE_RANGE``: filled by the page's rule)."""
    kind = "a number SCALE_RANGE (1: as trained)" if knob.kind == FACTOR else "text (empty: none)"
    return f"{knob.words}: {kind}; {knob.help}"


def advanced_parameter_lines() -> str:
    """The docstring lines of the knobs' parameters (Gradio shows one line per parameter)."""
    return "\n            ".join(f"{k.name}: {'number' if k.kind == FACTOR else 'text'}: {k.help}" for k in KNOBS)


def knob_inputs() -> dict[str, gr.components.Component]:
    """One hidden input per knob (inside the current Blocks context), at the knob's default."""
    return {k.name: gr.Number(value=k.unset, label=k.words, elem_id=f"api-{k.name}") if k.kind == FACTOR else
            gr.Textbox(value=k.unset, label=k.words, elem_id=f"api-{k.name}") for k in KNOBS}


def advanced_values(given: Sequence[Any]) -> dict[str, Any]:
    """The knobs' values as settings fields, in ``KNOBS`` order (an omitted one: its default; a shorter list: the
    rest at their defaults)."""
    values = list(given) + [None] * (len(KNOBS) - len(given))
    return {k.name: k.unset if value is None else value
            for k, value in zip(KNOBS, values, strict=False)}


def flattened(call: Callable[..., Any], function: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` (a wrapper of ``function``) with ``function``'s ``*advanced`` shown as one named parameter per knob,
    and its keyword-only parameters (``request``, ``progress``) after them as ordinary ones; ``call`` itself is
    returned unchanged when ``function`` has no ``*advanced``."""
    params = list(inspect.signature(function).parameters.values())
    if not any(p.kind is _Param.VAR_POSITIONAL for p in params):
        return call
    fixed = [p for p in params if p.kind is _Param.POSITIONAL_OR_KEYWORD]
    keywords = [p.replace(kind=_Param.POSITIONAL_OR_KEYWORD) for p in params if p.kind is _Param.KEYWORD_ONLY]
    knobs = [_Param(k.name, _Param.POSITIONAL_OR_KEYWORD, default=k.unset,
                    annotation="float" if k.kind == FACTOR else "str") for k in KNOBS]
    shown = inspect.Signature([*fixed, *knobs, *keywords],
                              return_annotation=inspect.signature(function).return_annotation)

    def flat(*args: Any, **kwargs: Any) -> Any:
        bound = shown.bind(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        return call(*(given[p.name] for p in fixed), *(given[k.name] for k in KNOBS),
                    **{p.name: given[p.name] for p in keywords})

    for name in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(flat, name, getattr(call, name))
    flat.__annotations__ = {**getattr(function, "__annotations__", {}), **{k.name: k.annotation for k in knobs}}
    flat.__signature__ = shown  # type: ignore[attr-defined]  # inspect.signature reads it: Gradio's API page
    flat.__wrapped__ = function  # type: ignore[attr-defined]  # typing.get_type_hints resolves names there
    return flat
