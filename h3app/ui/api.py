"""Named API endpoints for ``gradio_client``: ``/inspect``, ``/load``, ``/set_lora``, ``/generate``,
``/check_equivalence``, ``/grid``.

They take plain, typed parameters (hidden components, so the UI's own events stay private) and return JSON.
``/load`` and ``/set_lora`` edit the calling session's adapter settings (a ``gr.State``; a ``Client`` keeps its
session between calls) for its next job; ``/generate``, ``/check_equivalence`` and ``/grid`` use those settings,
or — for clients without a session — the adapters given explicitly as JSON (docs/architecture.md, decision 7).
"""

from __future__ import annotations

from typing import Any, Iterator

import gradio as gr

from ..errors import H3AppError
from ..settings import LoRASettings
from .adapter_events import AdapterEvents, user_error
from .comparison_events import ComparisonEvents
from .generate_events import GenerateEvents, build_request
from .session import check_slot, job_adapters, parse_adapters_json, parse_alpha, settings_from_json, with_adapter

GPU = {"concurrency_id": "gpu", "concurrency_limit": 1}


def _adapters(session: dict[str, Any] | None, adapters_json: str | None) -> tuple[dict[str, Any], list[LoRASettings]]:
    """The adapters a job carries: the explicit JSON when given, else the session's. Returns (session, adapters)."""
    explicit = parse_adapters_json(adapters_json)
    if explicit is None:
        return session, job_adapters(session)
    return session, explicit


class ApiEvents:
    """The functions behind the named endpoints."""

    def __init__(self, adapters: AdapterEvents, generate: GenerateEvents, comparisons: ComparisonEvents) -> None:
        self.adapters = adapters
        self.generate_events = generate
        self.comparisons = comparisons

    def inspect(self, source: str, weight_name: str, revision: str, token: str) -> dict[str, Any]:
        """Header-only inspection (the ``inspect --json`` object) plus the repo's weight files."""
        info = self.adapters.inspect(source, weight_name or None, revision or None, token or None)
        try:
            files = self.adapters.backend.list_weights(source.strip(), revision or None, token or None)
        except H3AppError as error:
            raise user_error(error) from error
        return {**info, "weight_files": [{"name": f.name, "size": f.size} for f in files]}

    def load(self, session: dict[str, Any] | None, slot: float, source: str, weight_name: str, revision: str,
             alpha: str, scale: float, mode: str, token: str, request: gr.Request = None,
             progress: Any = gr.Progress()) -> tuple[dict[str, Any], dict[str, Any]]:
        """Fetch + bind the adapter and make it the session's ``slot``: (session, {settings, report, provenance})."""
        try:
            slot_name = check_slot(slot)
            settings = settings_from_json({"source": source, "weight_name": weight_name, "revision": revision,
                                           "alpha": alpha, "strength": scale, "mode": mode or "unmerged"})
        except H3AppError as error:
            raise user_error(error) from error
        session, result = self.adapters.load(session, slot_name, settings, "t2va", token, request, progress)
        return session, {"slot": slot_name, "settings": session["adapters"][slot_name],
                         "report": result.report.to_json(), "provenance": result.provenance,
                         "summary": result.report.summary()}

    def set_lora(self, session: dict[str, Any] | None, slot: float, alpha: str, scale: float, mode: str,
                 source: str, weight_name: str, revision: str, enabled: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        """Edit the session's ``slot`` for its next job: alpha (``auto`` or a number), scale, mode; a source
        (re)places the adapter; ``enabled=False`` removes it. Nothing runs."""
        try:
            slot_name = check_slot(slot)
            if not enabled:
                session = with_adapter(session, slot_name, None)
                return session, {"adapters": session["adapters"]}
            current = dict((session or {}).get("adapters", {}).get(slot_name) or {})
            if source and source.strip():
                current = {"source": source.strip(), "weight_name": weight_name or None, "revision": revision or None}
            if not current:
                raise H3AppError(f"adapter slot {slot_name} is empty: give a source (or call /load first).")
            current.update({"alpha": parse_alpha(alpha), "strength": scale, "mode": mode or current.get("mode") or
                            "unmerged"})
            session = with_adapter(session, slot_name, settings_from_json(current))
        except H3AppError as error:
            raise user_error(error) from error
        return session, {"adapters": session["adapters"]}

    def generate(self, session: dict[str, Any] | None, prompt: str, seed: float, steps: float, duration: float,
                 height: float, width: float, shift: float, audio_shift: float, workflow: str,
                 first_frame: str | None = None, last_frame: str | None = None, references: list[Any] | None = None,
                 adapters_json: str = "", token: str = "", request: gr.Request = None, progress: Any = gr.Progress()
                 ) -> tuple[Any, dict[str, Any]]:
        """One generation → (mp4 with audio, ``generate --json`` + settings)."""
        try:
            generation = build_request(workflow, prompt, seed, steps, duration, height, width, shift, audio_shift,
                                       first_frame, last_frame, references, lenient=False)
            _, adapters = _adapters(session, adapters_json)
        except H3AppError as error:
            raise user_error(error) from error
        output = self.generate_events.generate(generation, adapters, token, request, progress)
        if output is None:
            raise gr.Error("the generation was cancelled.", print_exception=False)
        return output.video_path, {**output.to_json(), "settings": output.settings}

    def check_equivalence(self, session: dict[str, Any] | None, prompt: str, seed: float, steps: float,
                          duration: float, height: float, width: float, alpha_a: str, scale_a: float, alpha_b: str,
                          scale_b: float, adapters_json: str, token: str, request: gr.Request = None,
                          progress: Any = gr.Progress()) -> dict[str, Any]:
        """A vs B vs the alpha = rank fallback (+ A-vs-A control) through the full pipeline → ``check --json``."""
        try:
            session, adapters = _adapters(session, adapters_json)
        except H3AppError as error:
            raise user_error(error) from error
        probe = {"adapters": {str(i + 1): a for i, a in enumerate(_as_json(adapters))}}
        fields = ("t2va", prompt, seed, steps, duration, height, width, None, None, None, None, None)
        result = self.comparisons.check(probe, None, fields, alpha_a, scale_a, alpha_b, scale_b, token, request,
                                        progress)
        if result is None:
            raise gr.Error("the equivalence check was cancelled.", print_exception=False)
        return result.to_json()

    def grid(self, session: dict[str, Any] | None, prompt: str, steps: float, duration: float, height: float,
             width: float, alphas: str, scales: str, seeds: str, adapters_json: str, token: str,
             request: gr.Request = None, progress: Any = gr.Progress()) -> Iterator[list[dict[str, Any]]]:
        """Alpha × scale × seed cells as they finish (a growing list of cell JSON, distances to no-LoRA)."""
        try:
            session, adapters = _adapters(session, adapters_json)
        except H3AppError as error:
            raise user_error(error) from error
        probe = {"adapters": {str(i + 1): a for i, a in enumerate(_as_json(adapters))}}
        fields = ("t2va", prompt, 0, steps, duration, height, width, None, None, None, None, None)
        cells: list[dict[str, Any]] = []
        for cell in self.comparisons.grid_cells(probe, None, fields, alphas, scales, seeds, token, request, progress):
            cells.append(cell.to_json())
            yield list(cells)
        if not cells:
            yield []


def _as_json(adapters: list[LoRASettings]) -> list[dict[str, Any]]:
    from .session import settings_to_json

    return [settings_to_json(a) for a in adapters]


def build_api(events: ApiEvents, session: gr.State) -> None:
    """Hidden inputs and trigger buttons for the named endpoints (inside the current Blocks context)."""
    with gr.Column(visible=False):
        text = {name: gr.Textbox(value=value, label=name) for name, value in (
            ("source", ""), ("weight_name", ""), ("revision", ""), ("token", ""), ("alpha", "auto"),
            ("mode", "unmerged"), ("prompt", "a red fox running through snow, wind howling"), ("workflow", "t2va"),
            ("adapters_json", ""), ("alpha_a", "8"), ("alpha_b", "128"), ("alphas", "8, auto"),
            ("scales", "0.5, 1.0"), ("seeds", "7"))}
        number = {name: gr.Number(value=value, label=name) for name, value in (
            ("slot", 1), ("scale", 1.0), ("seed", 7), ("steps", 5), ("duration", 5.0), ("height", 0), ("width", 0),
            ("shift", 0), ("audio_shift", 0), ("scale_a", 1.0), ("scale_b", 0.0625))}
        enabled = gr.Checkbox(value=True, label="enabled")
        first_frame = gr.File(label="first_frame", type="filepath")
        last_frame = gr.File(label="last_frame", type="filepath")
        references = gr.File(label="references", file_count="multiple", type="filepath")
        result = gr.JSON()
        video = gr.Video()
        buttons = {name: gr.Button(name) for name in ("inspect", "load", "set_lora", "generate",
                                                       "check_equivalence", "grid")}

    buttons["inspect"].click(events.inspect, [text["source"], text["weight_name"], text["revision"], text["token"]],
                             [result], api_name="inspect", concurrency_id="inspect", concurrency_limit=4)
    buttons["load"].click(events.load, [session, number["slot"], text["source"], text["weight_name"],
                                        text["revision"], text["alpha"], number["scale"], text["mode"], text["token"]],
                          [session, result], api_name="load", **GPU)
    buttons["set_lora"].click(events.set_lora, [session, number["slot"], text["alpha"], number["scale"], text["mode"],
                                                text["source"], text["weight_name"], text["revision"], enabled],
                              [session, result], api_name="set_lora", queue=False)
    buttons["generate"].click(events.generate, [session, text["prompt"], number["seed"], number["steps"],
                                                number["duration"], number["height"], number["width"],
                                                number["shift"], number["audio_shift"], text["workflow"], first_frame,
                                                last_frame, references, text["adapters_json"], text["token"]],
                              [video, result], api_name="generate", **GPU)
    buttons["check_equivalence"].click(
        events.check_equivalence, [session, text["prompt"], number["seed"], number["steps"], number["duration"],
                                   number["height"], number["width"], text["alpha_a"], number["scale_a"],
                                   text["alpha_b"], number["scale_b"], text["adapters_json"], text["token"]],
        [result], api_name="check_equivalence", **GPU)
    buttons["grid"].click(events.grid, [session, text["prompt"], number["steps"], number["duration"], number["height"],
                                        number["width"], text["alphas"], text["scales"], text["seeds"],
                                        text["adapters_json"], text["token"]],
                          [result], api_name="grid", **GPU)
