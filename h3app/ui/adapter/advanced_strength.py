"""The "Advanced strength" section of an adapter slot: video / audio sliders (text in a small box), a strength
schedule with a plot of the factor over the evaluations, and the per-block ranges. Pure event functions on a small
form; every value is parsed by ``h3app.rules`` (the same one-line refusals as the CLI and the API) and reaches the
job as ``LoRASettings`` fields (docs/lora-engine.md, "Advanced strength")."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import gradio as gr

from ...errors import H3AppError
from ...rules.modality import MODALITIES, MODALITY_SLIDER
from ...rules.schedule import parse_schedule
from ...rules.steps import evaluations
from ...rules.values import STRENGTH
from ...settings import LoRASettings
from ..change_events import ChangeEvents
from ..presenters.visitor_words import visitor_text
from ..unclamped import unclamped

FIELDS = ("video_strength", "text_strength", "audio_strength", "strength_schedule", "block_strength")
SLIDERS = ("video_strength", "audio_strength")  # the two sliders (text: a number box with the API's range)
SCHEDULE_HINT = "1,1,0.5,0.5 · linear:1:0.5 · cosine:1:0@0.2-0.8 · constant:0.5@0-0.5"
BLOCKS_HINT = "0-9:0.5, 40-49:1.2"
PLOT_SIZE = (260, 90)  # px of the schedule plot


@dataclass(frozen=True)
class AdvancedForm:
    """What the section's controls hold (raw: sliders give numbers, boxes text)."""

    video_strength: Any = 1.0
    text_strength: Any = 1.0
    audio_strength: Any = 1.0
    strength_schedule: Any = ""
    block_strength: Any = ""

    def fields(self) -> dict[str, Any]:
        """The ``LoRASettings`` fields, checked (``H3AppError``, one line, for a bad value; a slider's value also
        within the sliders' range, ``rules.modality.MODALITY_SLIDER``: refused, never clamped)."""
        given = {name: getattr(self, name) for name in FIELDS}
        given = {name: ("" if value is None else value) for name, value in given.items()}
        settings = LoRASettings(source="advanced", **given)
        for name in SLIDERS:
            MODALITY_SLIDER.check(getattr(settings, name), name.replace("_", " "))
        return {name: getattr(settings, name) for name in FIELDS}

    @classmethod
    def of(cls, settings: LoRASettings) -> AdvancedForm:
        """The form showing ``settings``' advanced strengths (load settings, a preset)."""
        return cls(**{name: getattr(settings, name) for name in FIELDS})


def note(form: AdvancedForm) -> str:
    """One line under the controls: what the values mean now, or the refusal of a bad one."""
    try:
        fields = form.fields()
    except H3AppError as error:
        return f"⚠ {visitor_text(str(error))}"
    parts = []
    factors = {m: fields[f"{m}_strength"] for m in MODALITIES}
    if any(value != 1.0 for value in factors.values()):
        zero = [m for m, value in factors.items() if value == 0.0]
        parts.append(", ".join(f"{m} ×{value:g}" for m, value in factors.items())
                     + (f": the adapter changes nothing {' or '.join(zero)} rows compute themselves (they still "
                        f"attend to rows it changed)" if zero else ""))
    if fields["strength_schedule"]:
        parts.append(f"schedule {fields['strength_schedule']} (× strength per evaluation)")
    if fields["block_strength"]:
        parts.append(f"blocks {fields['block_strength']} (× group strengths)")
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
    """The section's components (``parts`` by form field, the plot and the note)."""

    video_strength: gr.Slider
    text_strength: gr.Number
    audio_strength: gr.Slider
    strength_schedule: gr.Textbox
    block_strength: gr.Textbox
    plot: gr.HTML
    note: gr.Markdown

    @property
    def parts(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FIELDS}


def build(slot: str) -> AdvancedSection:
    """The "Advanced strength" accordion of adapter slot ``slot`` (closed; all factors 1)."""
    low, high = MODALITY_SLIDER.low, MODALITY_SLIDER.high  # the ends of the rule that checks them (never clamped)
    with gr.Accordion("Advanced strength", open=False, elem_id=f"advanced-{slot}"):
        with gr.Row():
            video = unclamped(gr.Slider(low, high, value=1.0, step=0.05, label="Video strength",
                                        elem_id=f"video-strength-{slot}",
                                        info="× on the adapter's delta of every video row"))
            audio = unclamped(gr.Slider(low, high, value=1.0, step=0.05, label="Audio strength",
                                        elem_id=f"audio-strength-{slot}",
                                        info="0: keep the style, leave what audio rows compute"))
            text = unclamped(gr.Number(value=1.0, label="Text", elem_id=f"text-strength-{slot}", min_width=80),
                             STRENGTH.low, STRENGTH.high)
        with gr.Row():
            schedule = gr.Textbox(label="Strength over the steps", placeholder=SCHEDULE_HINT,
                                  elem_id=f"strength-schedule-{slot}",
                                  info="one factor per evaluation, or a curve with @from-to fractions")
            plot = gr.HTML(schedule_plot("", None), elem_id=f"schedule-plot-{slot}")
        blocks = gr.Textbox(label="Per-block strength", placeholder=BLOCKS_HINT, elem_id=f"block-strength-{slot}",
                            info="× the group strengths of these main blocks")
        shown = gr.Markdown(note(AdvancedForm()), elem_id=f"advanced-note-{slot}")
    return AdvancedSection(video, text, audio, schedule, blocks, plot, shown)


def wire(section: AdvancedSection, steps: gr.components.Component, changes: ChangeEvents) -> None:
    """Redraw the note on any change and the plot on a schedule or steps change (no queue, no model)."""
    controls = list(section.parts.values())

    def shown(*values: Any) -> str:
        return note(AdvancedForm(*values))

    changes.on([control.change for control in controls], shown, controls, section.note)
    changes.on([section.strength_schedule.change, steps.change], schedule_plot, [section.strength_schedule, steps],
               section.plot)
