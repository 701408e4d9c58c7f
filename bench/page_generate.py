"""P6's page rows: the page's Generate against the API's ``/generate`` for the same request (80 steps, the tiny model,
the demo style adapter), in the same process, interleaved round by round.

Ours: what the page's Generate event does — ``GenerateEvents.generate_views`` with the request's ``PreviewBoard``
at the page's budget (``ui/generate/preview_stream.PAGE_PREVIEW_BUDGET``), its updates through ``streamed_reply``
(each preview image sent once), every image through ``gr.Image.postprocess`` as Gradio does with a yielded picture
(a PNG in Gradio's cache), and the finished view (snippets, history). Peer: what ``/generate`` runs —
``GenerateEvents.generate``, the same worker job without previews. Two rows: "Step preview" on (the previews thinned
to their budget; goal ≤ 1.1×) and off (goal ≤ 1.05×: the same work). Then the page's one estimator
(``ui/generate/estimates.py``), taught by those runs: its estimate before each of a few more runs at the same size,
over the run's measured seconds (goal 0.7×–1.3×).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .table import Goal, Row
from .timing import Variant, compare

CASE = "P6"
STEPS = 80
PROMPT = "a red ball moving right over a grey floor, low soft hum"
STYLE = Path(__file__).resolve().parents[1] / "assets" / "adapters" / "tiny_style_warm.safetensors"


def page_generate(events: Any, form: Any, previews: bool) -> dict[str, Any]:
    """One Generate as the page runs it; returns what it showed: images sent and the board's summary."""
    import gradio as gr
    import numpy as np

    from h3app.backend.preview import PreviewBoard
    from h3app.ui.generate.preview_stream import (
        PAGE_PREVIEW_BUDGET,
        GeneratePreview,
        generate_finished,
        generate_update,
    )
    from h3app.ui.job_wiring import streamed_reply

    image, note = gr.Image(format="png"), gr.Markdown()
    parts, board = GeneratePreview(image, note), PreviewBoard(budget=PAGE_PREVIEW_BUDGET)
    views = events.generate_views(form, (), None, None, board, previews)
    sent = 0
    for update in streamed_reply("status", {"video": "video"}, views, lambda now: generate_update(parts, board, now),
                                 lambda stopped: generate_finished(parts, board, stopped)):
        if isinstance(update, dict) and isinstance(update.get(image), np.ndarray):
            image.postprocess(update[image])  # Gradio writes each yielded picture to its cache as a PNG
            sent += 1
    return {"sent": sent, **board.summary(), "thinned": board.thinned}


def rows(backend: Any, repeats: int, clock: str) -> list[Row]:
    """The page's Generate with "Step preview" on and off, each over ``/generate``'s job (medians of ``repeats``
    interleaved rounds after a warm-up)."""
    from h3app.rules.choices import UNMERGED
    from h3app.settings import LoRASettings
    from h3app.ui.forms import JobForm, RequestForm
    from h3app.ui.generate.events import GenerateEvents
    from h3app.ui.session import RunningJobs, job_adapters, with_adapter

    events = GenerateEvents(backend, RunningJobs())
    session = with_adapter(None, "1", LoRASettings(source=str(STYLE)))
    form = JobForm(session, UNMERGED, RequestForm(prompt=PROMPT, seed=7, steps=STEPS), "")
    generation, adapters = form.request.to_request(), job_adapters(session, UNMERGED)
    shown: list[dict[str, Any]] = []
    timings = compare([Variant("api", lambda: events.generate(generation, adapters, None, None, None)),
                       Variant("on", lambda: shown.append(page_generate(events, form, True))),
                       Variant("off", lambda: page_generate(events, form, False))],
                      repeats=max(3, repeats), warmup=1, clock=clock)
    last = shown[-1]
    note = (f"{last['columns'].get('generation', 0)} previews of {STEPS - 1} evaluations, {last['sent']} images sent, "
            f"{last['thinned']} thinned; a preview costs {last['share_of_step']}× a step "
            f"({last['decoder']} decoder); best-of ratio {timings['on'].best / timings['api'].best:.2f}×")
    return [*_page_rows(timings, note, clock), _estimate_row(events, form, max(3, repeats), clock)]


def _estimate_row(events: Any, form: Any, rounds: int, clock: str) -> Row:
    """The estimate the page shows before a run at a size this server has run, over that run's seconds."""
    import statistics

    from h3app.ui.generate.estimates import estimator_for, sized

    estimator = estimator_for(events.backend)
    size = sized(form.request, events.backend.limits)
    pairs = []
    for _ in range(rounds):
        estimate = estimator.estimate(size)
        view = events.generate_view(form, progress=None)  # taught to the estimator as the page's runs are
        pairs.append((estimate.seconds, view.settings_json["result"]["seconds"]))
    ratios = [e / m for e, m in pairs]
    return Row(CASE, f"page estimate ÷ the run it then makes, {STEPS} steps (tiny, after a run at this size)",
               statistics.median(e for e, _ in pairs), "measured run", statistics.median(m for _, m in pairs),
               Goal("0.7×–1.3×", max_ratio=1.3, min_ratio=0.7),
               f"{estimate.source}; ratios {', '.join(f'{r:.2f}' for r in ratios)}", clock)


def _page_rows(timings: Any, note: str, clock: str) -> list[Row]:
    return [Row(CASE, f"page Generate, Step preview on, {STEPS} steps (tiny, style adapter)", timings["on"].median,
                "/generate (same job)", timings["api"].median, Goal("≤ 1.1×", max_ratio=1.1), note, clock),
            Row(CASE, f"page Generate, Step preview off, {STEPS} steps (tiny, style adapter)", timings["off"].median,
                "/generate (same job)", timings["api"].median, Goal("≤ 1.05×", max_ratio=1.05),
                f"best-of ratio {timings['off'].best / timings['api'].best:.2f}×", clock)]
