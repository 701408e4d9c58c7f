"""The "Advanced strength" section of an adapter slot: video / audio sliders (text in a small box), a strength
schedule with a plot of the factor over the evaluations, and the per-block ranges. Pure event functions on a small
form; every value is parsed by ``h3app.rules`` (the same one-line refusals as the CLI and the API) and reaches the
job as ``LoRASettings`` fields (docs/lora-engine.md, "Advanced strength")."""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gradio as gr

from ...errors import H3AppError
from ...rules.modality import MODALITIES, MODALITY_SLIDER
from ...rules.schedule import parse_schedule
from ...rules.steps import evaluations
from ...rules.values import STRENGTH
from ...settings import ADVANCED_FIELDS, FACTOR, KNOBS, Knob, LoRASettings, spelled
from ..change_events import ChangeEvents
from ..presenters.visitor_words import visitor_text
from ..unclamped import unclamped

# The section's placement (the one place the page names the advanced strengths; each control's label, info,
# placeholder and parser come from its knob, ``settings.KNOBS``): rows of knobs, the sliders, and where the plot goes.
ROWS = (("video_strength", "audio_strength", "text_strength"), ("strength_schedule",), ("block_strength",))
SLIDERS = ("video_strength", "audio_strength")  # the others: a number box with the API's range, or a text box
PLOT_BESIDE = "strength_schedule"  # the schedule's plot sits beside its box
PLOT_SIZE = (260, 90)  # px of the schedule plot
KnobControl = gr.Slider | gr.Number | gr.Textbox  # what a knob's control is
FIELDS = ADVANCED_FIELDS


@dataclass(frozen=True, init=False)
class AdvancedForm:
    """What the section's controls hold, by knob name (raw: sliders give numbers, boxes text); a knob not given
    holds its default."""

    values: Mapping[str, Any]
    CONTROLS = FIELDS  # the component names it reads (``forms.read``): the settings' field names

    def __init__(self, **given: Any) -> None:
        unknown = sorted(set(given) - set(FIELDS))
        if unknown:
            raise TypeError(f"AdvancedForm has no control {unknown[0]!r}")
        object.__setattr__(self, "values", {k.name: _shown(k, given.get(k.name, k.unset)) for k in KNOBS})

    def settings(self) -> LoRASettings:
        """The values as ``LoRASettings`` holds them, parsed once (``H3AppError``, one line, for a bad value; a
        slider's value also within the sliders' range, ``rules.modality.MODALITY_SLIDER``: refused, never
        clamped). Read its advanced strengths by attribute; its source is a placeholder."""
        settings = LoRASettings(source="advanced", **self.values)
        for name in SLIDERS:
            MODALITY_SLIDER.check(getattr(settings, name), name.replace("_", " "))
        return settings

    def fields(self) -> dict[str, Any]:
        """The ``LoRASettings`` fields (typed: a schedule as a ``StrengthSchedule``), checked as :meth:`settings`."""
        settings = self.settings()
        return {name: getattr(settings, name) for name in FIELDS}

    @classmethod
    def of(cls, settings: LoRASettings) -> AdvancedForm:
        """The form showing ``settings``' advanced strengths (load settings, a preset)."""
        return cls(**{name: getattr(settings, name) for name in FIELDS})


def _shown(knob: Knob, value: Any) -> Any:
    """What a control shows for ``value``: a number as it is, a parsed schedule or ranges by their label, None as
    empty text."""
    return value if knob.kind == FACTOR and value is not None else spelled(value) if knob.kind != FACTOR else ""


def note(form: AdvancedForm) -> str:
    """One line under the controls: what the values mean now, or the refusal of a bad one."""
    try:
        given = form.settings()
    except H3AppError as error:
        return f"⚠ {visitor_text(str(error))}"
    parts = []
    factors = dict(zip(MODALITIES, (given.modality.video, given.modality.text, given.modality.audio), strict=True))
    if not given.modality.is_unit:
        zero = [m for m, value in factors.items() if value == 0.0]
        parts.append(", ".join(f"{m} ×{value:g}" for m, value in factors.items())
                     + (f": the adapter changes nothing {' or '.join(zero)} rows compute themselves (they still "
                        f"attend to rows it changed)" if zero else ""))
    if given.schedule is not None:
        parts.append(f"schedule {given.schedule.label} (× strength per evaluation)")
    if given.blocks:
        parts.append(f"blocks {given.blocks.label} (× group strengths)")
    if not parts:
        return "All factors 1: the adapter runs at its strength on every row, step and block."
    return "; ".join(parts) + " — unmerged only."


def schedule_plot(schedule_text: Any, steps: Any) -> str:
    """An inline SVG of the schedule's factor per evaluation for a run of ``steps`` sigma points (N steps = N − 1
    evaluations), or one line saying why there is none (a schedule that does not parse: the note under the section
    says why, once; this line only points there)."""
    try:
        schedule = parse_schedule(schedule_text or "")
    except H3AppError:
        return "<div class='h3-schedule-plot'>No plot while the schedule is refused (the note below says why).</div>"
    try:
        count = evaluations(int(float(steps))) if steps not in (None, "") else 0
        if schedule is None:
            return "<div class='h3-schedule-plot'>No schedule: every evaluation at factor 1.</div>"
        if count < 1:
            return "<div class='h3-schedule-plot'>Give the steps to see the schedule.</div>"
        factors = schedule.per_evaluation(count)
    except (H3AppError, ValueError) as error:
        return f"<div class='h3-schedule-plot'>⚠ {html.escape(str(error))}</div>"
    return _svg(factors)


def _svg(factors: tuple[float, ...]) -> str:
    width, height = PLOT_SIZE
    pad = 14
    low, high = min(0.0, *factors), max(1.0, *factors)
    span = (high - low) or 1.0

    def x(index: int) -> float:
        return pad + (width - 2 * pad) * (index / (len(factors) - 1) if len(factors) > 1 else 0.5)

    def y(value: float) -> float:
        return height - pad - (height - 2 * pad) * (value - low) / span

    points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(factors))
    dots = "".join(f"<circle cx='{x(i):.1f}' cy='{y(v):.1f}' r='2.5'><title>evaluation {i + 1}: ×{v:g}</title>"
                   f"</circle>" for i, v in enumerate(factors))
    # drawn in its own coordinates and scaled to the panel (never wider than it): every point stays in view
    return (f"<svg class='h3-schedule-plot' role='img' viewBox='0 0 {width} {height}' width='{width}' "
            f"style='max-width: 100%; height: auto' preserveAspectRatio='xMinYMid meet' "
            f"aria-label='strength factor over {len(factors)} evaluations: {', '.join(f'{v:g}' for v in factors)}'>"
            f"<line x1='{pad}' x2='{width - pad}' y1='{y(1.0):.1f}' y2='{y(1.0):.1f}' stroke='currentColor' "
            f"stroke-opacity='0.25' stroke-dasharray='3 3'/>"
            f"<polyline points='{points}' fill='none' stroke='currentColor' stroke-width='1.5'/>{dots}"
            f"<text x='2' y='{y(high) + 4:.1f}' font-size='9'>{high:g}</text>"
            f"<text x='2' y='{y(low):.1f}' font-size='9'>{low:g}</text></svg>")


@dataclass
class AdvancedSection:
    """The section's components: one control per knob (``parts``, by field name), the plot and the note."""

    parts: dict[str, KnobControl]
    plot: gr.HTML
    note: gr.Markdown


def _control(knob: Knob, slot: str) -> KnobControl:
    """The knob's control: a slider (``SLIDERS``, the modality sliders' rule's ends), a number box (the API's
    range) or a text box; never clamped (``unclamped``)."""
    elem_id = f"{knob.name.replace('_', '-')}-{slot}"
    if knob.name in SLIDERS:
        low, high = MODALITY_SLIDER.low, MODALITY_SLIDER.high  # the ends of the rule that checks them
        return unclamped(gr.Slider(low, high, value=knob.default, step=0.05, label=knob.label, elem_id=elem_id,
                                   info=knob.info or None))
    if knob.kind == FACTOR:
        return unclamped(gr.Number(value=knob.default, label=knob.label, elem_id=elem_id, min_width=80,
                                   info=knob.info or None), STRENGTH.low, STRENGTH.high)
    return gr.Textbox(label=knob.label, placeholder=knob.example, elem_id=elem_id, info=knob.info or None)


def build(slot: str) -> AdvancedSection:
    """The "Advanced strength" accordion of adapter slot ``slot`` (closed; all factors 1), laid out by ``ROWS``."""
    knobs = {k.name: k for k in KNOBS}
    parts: dict[str, KnobControl] = {}
    plot = None
    with gr.Accordion("Advanced strength", open=False, elem_id=f"advanced-{slot}"):
        for row in ROWS:
            with gr.Row():
                for name in row:
                    parts[name] = _control(knobs[name], slot)
                    if name == PLOT_BESIDE:
                        plot = gr.HTML(schedule_plot("", None), elem_id=f"schedule-plot-{slot}")
        shown = gr.Markdown(note(AdvancedForm()), elem_id=f"advanced-note-{slot}")
    unplaced = [name for name in FIELDS if name not in parts]
    if unplaced or plot is None:  # a knob added to LoRASettings needs its place here
        raise RuntimeError(f"ROWS must place every advanced strength and {PLOT_BESIDE}; missing: {unplaced}")
    return AdvancedSection({name: parts[name] for name in FIELDS}, plot, shown)


def wire(section: AdvancedSection, steps: gr.Slider | gr.Number, changes: ChangeEvents) -> None:
    """Redraw the note on any change and the plot on a schedule or steps change (no queue, no model)."""
    names, controls = list(section.parts), list(section.parts.values())

    def shown(*values: Any) -> str:
        return note(AdvancedForm(**dict(zip(names, values, strict=True))))

    schedule = section.parts[PLOT_BESIDE]
    changes.on([control.change for control in controls], shown, controls, section.note)
    changes.on([schedule.change, steps.change], schedule_plot, [schedule, steps], section.plot)
