"""The Grid tab's "How two adapters differ" panel: pick A and B (a demo, or any source as ``SOURCE,alpha=A,scale=S``),
Compare, and read the overall cosine of their effective deltas and a heat map of it per main block × module group
(``backend/adapter_diff.py``, the math in ``lora/similarity.py``; the CLI's ``diff`` gives the same JSON)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gradio as gr

from ...backend.adapter_diff import diff_adapters
from ...errors import H3AppError
from ...rules import values
from ...rules.choices import UNMERGED
from ...settings import LoRASettings
from ..user_error import user_error

if TYPE_CHECKING:  # the one type the page holds the backend as (docs/architecture.md)
    from ...backend.service import Backend

DIFF_INTRO = ("**How two adapters differ** — the cosine of their effective deltas ΔW (each at its alpha and scale: "
              "`SOURCE,alpha=8,scale=0.5`), overall and per block × module group: +1 the same direction, 0 "
              "unrelated, −1 opposite. Read from the two files' factors only.")


@dataclass
class DiffPanel:
    a: gr.Dropdown
    b: gr.Dropdown
    button: gr.Button
    heat: gr.HTML
    result: gr.JSON


def build_diff_panel(demos: Sequence[tuple[str, str]] = ()) -> DiffPanel:
    """Two pickers (the demos offered, any source typed), Compare, the heat map and the JSON."""
    with gr.Accordion("How two adapters differ", open=False, elem_id="diff-panel"):
        gr.Markdown(DIFF_INTRO, elem_classes=["h3-note"])
        with gr.Row(equal_height=True):
            a = gr.Dropdown(list(demos), value=None, allow_custom_value=True, label="A", scale=2, elem_id="diff-a")
            b = gr.Dropdown(list(demos), value=None, allow_custom_value=True, label="B", scale=2, elem_id="diff-b")
            button = gr.Button("Compare A and B", variant="secondary", scale=1, elem_id="diff-run")
        heat = gr.HTML("", elem_id="diff-heat")
        with gr.Accordion("The comparison as JSON", open=False):
            result = gr.JSON(open=False)
    return DiffPanel(a, b, button, heat, result)


def parse_side(text: str | None, name: str) -> LoRASettings:
    """``SOURCE[,weight=F][,rev=R][,alpha=A][,scale=S]`` → settings (one line for a bad field)."""
    source, *fields = [part.strip() for part in str(text or "").split(",")]
    if not source:
        raise H3AppError(f"{name} is empty: pick a demo adapter or type a Hub repo id, URL or path.")
    keys = {"weight": "weight_name", "rev": "revision", "alpha": "alpha", "scale": "strength"}
    given: dict[str, Any] = {}
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep or key.strip() not in keys:
            raise H3AppError(f"{name}: unknown field {values.short(field)}; use weight=, rev=, alpha=, scale=.")
        name_ = keys[key.strip()]
        given[name_] = (values.parse_alpha(value, f"{name} alpha") if name_ == "alpha" else
                        values.parse_strength(value, f"{name} scale") if name_ == "strength" else value.strip())
    return LoRASettings(source=source, mode=UNMERGED, **given)


def colour(cosine: float | None) -> str:
    """Blue toward +1, white at 0, red toward −1; grey where a side has no delta."""
    if cosine is None:
        return "#ddd"
    t = max(-1.0, min(1.0, cosine))
    if t >= 0:
        return f"rgb({round(255 - 155 * t)},{round(255 - 105 * t)},255)"
    return f"rgb(255,{round(255 + 155 * t)},{round(255 + 155 * t)})"


def heat_html(result: dict[str, Any]) -> str:
    """The overall cosine, then a table: a row per main block (and one for what lies outside them), a column per
    module group, each cell coloured by its cosine and titled with both norms."""
    groups = sorted({row["group"] for row in result["blocks"]})
    blocks = sorted({row["block"] for row in result["blocks"]}, key=lambda b: -1 if b is None else b)
    at = {(row["block"], row["group"]): row for row in result["blocks"]}
    head = "".join(f"<th>{html.escape(g)}</th>" for g in groups)
    body = []
    for block in blocks:
        cells = []
        for group in groups:
            row = at.get((block, group))
            if row is None:
                cells.append("<td></td>")
                continue
            cos = row["cosine"]
            shown = "—" if cos is None else f"{cos:+.2f}"
            title = f"‖ΔA‖ {row['norm_a']:.3g} · ‖ΔB‖ {row['norm_b']:.3g}"
            cells.append(f"<td style='background:{colour(cos)};text-align:center' title='{title}'>{shown}</td>")
        name = "outside the blocks" if block is None else f"block {block}"
        body.append(f"<tr><th>{name}</th>{''.join(cells)}</tr>")
    overall = result["cosine"]
    words = "—" if overall is None else f"{overall:+.3f}"
    notes = "".join(f"<p>{html.escape(n)}</p>" for n in result.get("notes") or ())
    return (f"<div class='h3-card' data-testid='diff-cosine'><p><b>cosine {words}</b> over {result['modules']} "
            f"weights (‖ΔA‖ {result['norm_a']:.4g}, ‖ΔB‖ {result['norm_b']:.4g})</p>"
            f"<table class='h3-table' data-testid='diff-heat-map'><thead><tr><th>block ╲ group</th>{head}</tr>"
            f"</thead><tbody>{''.join(body)}</tbody></table>{notes}</div>")


def wire_diff_panel(backend: Backend, panel: DiffPanel, token: gr.Textbox) -> None:
    """Compare → the heat map and the JSON (a queued cheap event: it reads two adapter files, no GPU)."""

    def compare(a: str | None, b: str | None, token_value: str | None) -> tuple[str, dict[str, Any]]:
        try:
            result = diff_adapters(backend.binder, parse_side(a, "A"), parse_side(b, "B"), token_value or None)
        except H3AppError as error:
            raise user_error(error) from error
        return heat_html(result), result

    # private: the page's panel, not a named endpoint (the API's six are a contract, docs/ui.md); one file pair read
    # at a time per server, apart from the GPU's queue
    panel.button.click(compare, [panel.a, panel.b, token], [panel.heat, panel.result], api_visibility="private",
                       concurrency_id="diff", concurrency_limit=1)
