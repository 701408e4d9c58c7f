"""Named API endpoints for ``gradio_client``: ``/inspect``, ``/load``, ``/set_lora``, ``/generate``,
``/check_equivalence``, ``/grid``.

They take plain, typed parameters (hidden components, so the UI's own events stay private) and return JSON.
``/load`` and ``/set_lora`` edit the calling session's adapter settings (a ``gr.State``; a ``Client`` keeps its
session between calls) for its next job; ``/generate``, ``/check_equivalence`` and ``/grid`` use those settings,
or — for clients without a session — the adapters given explicitly as JSON (docs/architecture.md, decision 7).
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gradio as gr

from ...adapters.summary import applied_lines, not_applied_lines
from ...backend.limits import HOSTED_MAX_STEPS
from ...errors import H3AppError
from ...hosting.gpu_gate import admitted, gpu_events
from ...rules.check_pair import DEFAULT_A, DEFAULT_B
from ...rules.choices import LORA_MODES, T2VA, UNMERGED
from ...rules.frames import RELEASED
from ...rules.values import ALPHA, MAX_FIELD_CHARS, MAX_SEED, STRENGTH
from ...settings import KNOBS, LoRASettings
from ..adapter.events import AdapterEvents
from ..compare.events import ComparisonEvents
from ..forms import CheckForm, GridForm, JobForm, RequestForm
from ..generate.events import GenerateEvents, Stopped
from ..session import (
    Session,
    adapters_json_words,
    check_slot,
    job_adapters,
    new_session,
    parse_adapters_json,
    with_adapter,
)
from ..user_error import user_error
from .advanced_parameters import advanced_parameter_lines, advanced_values, api_label, flattened, knob_inputs
from .endpoint_guard import public_report


class ApiEvents:
    """The functions behind the named endpoints. Their docstrings are what the app's API page shows: plain text
    (the ranges of the rules that check each parameter are filled in per app by :func:`api_doc`)."""

    def __init__(self, adapters: AdapterEvents, generate: GenerateEvents, comparisons: ComparisonEvents) -> None:
        self.adapters = adapters
        self.generate_events = generate
        self.comparisons = comparisons

    def inspect(self, source: str, weight_name: str, revision: str, token: str) -> dict[str, Any]:
        """Read an adapter's header only (nothing is downloaded): format, rank, targets, alpha and where it comes
        from, match against this model, and the weight files of its repo or folder with their sizes.

        Parameters:
            source: text, at most TEXT_CHARS characters: a Hub repo id (owner/name), an HF URL or a local path
            weight_name: text: the .safetensors file in the repo or folder (empty when there is only one)
            revision: text: branch, tag or commit (empty: main)
            token: text: a Hugging Face token for private or gated repos (empty: none)
        Returns:
            the same object as `python -m h3app inspect --json`, plus weight_files: a list of {name, size}
        """
        info = self.adapters.inspect(source, weight_name or None, revision or None, token or None)
        try:
            files = self.adapters.backend.list_weights(source.strip(), revision or None, token or None)
        except H3AppError as error:
            raise user_error(error) from error
        return {**info, "weight_files": [{"name": f.name, "size": f.size} for f in files]}

    def load(self, session: Session | None, slot: float, source: str, weight_name: str, revision: str,
             alpha: str, scale: float, mode: str, token: str, *advanced: Any,
             request: gr.Request | None = None, progress: Any = gr.Progress()) -> tuple[Session, dict[str, Any]]:
        """Download only the pinned weight file, bind it to the model and make it this session's adapter in
        slot 1 or 2 (the next /generate, /check_equivalence and /grid of this client use it).

        Parameters:
            slot: 1 or 2
            source: text, at most TEXT_CHARS characters: a Hub repo id, an HF URL or a local path
            weight_name: text: the .safetensors file (empty when there is only one)
            revision: text: branch, tag or commit (empty: main)
            alpha: text: a number ALPHA_RANGE, or auto (the file's own alpha chain)
            scale: number SCALE_RANGE: the strength multiplier (1.0 = as trained; negative pushes the other way)
            mode: text: unmerged (exact, free alpha/scale changes) or merged (faster steps)
            token: text: a Hugging Face token (empty: none)
            ADVANCED_PARAMETERS
        Returns:
            {slot, settings, report (matched/unmatched keys), provenance (commit, sha256, alpha source), summary}
        """
        try:
            slot_name = check_slot(slot)
            settings = LoRASettings.from_json({"source": source, "weight_name": weight_name, "revision": revision,
                                               "alpha": alpha, "strength": scale, "mode": mode or UNMERGED,
                                               **advanced_values(advanced)})
        except H3AppError as error:
            raise user_error(error) from error
        session, result = self.adapters.load(session, slot_name, settings, T2VA, token, request, progress)
        name = result.provenance.get("weight_name") or Path(settings.source).name
        return session, {"slot": slot_name, "settings": session.adapters[slot_name].to_json(),
                         "report": public_report(result.report.to_json(), name), "provenance": result.provenance,
                         "summary": result.report.summary()}

    def set_lora(self, session: Session | None, slot: float, alpha: str, scale: float, mode: str,
                 source: str, weight_name: str, revision: str, enabled: bool,
                 *advanced: Any) -> tuple[Session, dict[str, Any]]:
        """Edit this session's adapter in slot 1 or 2 for its next job; nothing runs and nothing is downloaded.

        Parameters:
            slot: 1 or 2
            alpha: text: a number ALPHA_RANGE, or auto
            scale: number SCALE_RANGE: the strength multiplier
            mode: text: unmerged or merged
            source: text: a new adapter for the slot (empty: keep the slot's adapter)
            weight_name: text: the new adapter's weight file (with source)
            revision: text: the new adapter's revision (with source)
            enabled: boolean: false removes the slot's adapter
            ADVANCED_PARAMETERS
        Returns:
            {adapters: slot -> settings} after the edit
        """
        try:
            slot_name = check_slot(slot)
            if not enabled:
                session = with_adapter(session, slot_name, None)
                return session, {"adapters": session.adapters_json()}
            held = (session or new_session()).adapters.get(slot_name)
            current = held.to_json() if held is not None else {}
            if source and source.strip():
                current = {"source": source.strip(), "weight_name": weight_name or None, "revision": revision or None}
            if not current:
                raise H3AppError(f"adapter slot {slot_name} is empty: give a source (or call /load first).")
            current.update({"alpha": alpha, "strength": scale, "mode": mode or current.get("mode") or UNMERGED,
                            **advanced_values(advanced)})
            session = with_adapter(session, slot_name, LoRASettings.from_json(current))
        except H3AppError as error:
            raise user_error(error) from error
        return session, {"adapters": session.adapters_json()}

    def generate(self, session: Session | None, prompt: str, seed: float, steps: float, duration: float,
                 height: float, width: float, shift: float, audio_shift: float, workflow: str,
                 first_frame: str | None = None, last_frame: str | None = None, references: list[Any] | None = None,
                 adapters_json: str = "", token: str = "", request: gr.Request | None = None,
                 progress: Any = gr.Progress()
                 ) -> tuple[Any, dict[str, Any]]:
        """Generate one video with stereo audio, with this session's adapters or the ones given in adapters_json.

        Parameters:
            prompt: text: what the video shows and sounds like (PROMPT_RULE)
            seed: whole number SEED_RANGE (same seed and settings: the same output, bit for bit)
            steps: whole number STEPS_RANGE: sigma points including the terminal one (N steps run N-1 evaluations)
            duration: number, seconds: DURATION_RANGE
            height: whole number, pixels: CANVAS_RULE (0: the model's default canvas; give width too)
            width: whole number, pixels: CANVAS_RULE (0: the model's default)
            shift: number > 0: the video flow shift (0: the model's default)
            audio_shift: number > 0: the audio flow shift (0: the model's default)
            workflow: text: t2va (text), fl2va (first/last keyframes) or ref2va (references)
            first_frame: file: fl2va's first keyframe image
            last_frame: file: fl2va's last keyframe image
            references: files: ref2va's reference images, videos or audio
            adapters_json: ADAPTERS_JSON
            token: text: a Hugging Face token (empty: none)
        Returns:
            the mp4, and the `generate --json` object with the run's full settings, applied: one line per adapter,
            and not_applied: one line per adapter that left keys of its file out (how many, which, why)
        """
        form = RequestForm(workflow=workflow, prompt=prompt, seed=seed, steps=steps, duration=duration,
                           height=height, width=width, shift=shift, audio_shift=audio_shift, first_frame=first_frame,
                           last_frame=last_frame, references=references)
        try:
            generation = form.to_request(lenient=False)
            adapters = _adapters(session, adapters_json)
        except H3AppError as error:
            raise user_error(error) from error
        output = self.generate_events.generate(generation, adapters, token, request, progress)
        if isinstance(output, Stopped):
            raise gr.Error("the generation was cancelled.", print_exception=False)
        return output.video_path, {**output.to_json(), "settings": output.settings,
                                   "applied": applied_lines(output.settings.get("adapters") or ()),
                                   "not_applied": not_applied_lines(output.settings.get("adapters") or ())}

    def check_equivalence(self, session: Session | None, prompt: str, seed: float, steps: float,
                          duration: float, height: float, width: float, alpha_a: str, scale_a: float, alpha_b: str,
                          scale_b: float, adapters_json: str, token: str, request: gr.Request | None = None,
                          progress: Any = gr.Progress()) -> dict[str, Any]:
        """Run the old alpha = rank fallback, A, A's first step again (determinism control) and B through the full
        pipeline with the first adapter, and say whether A and B are bit-identical.

        Parameters:
            prompt: text: the request's prompt (PROMPT_RULE)
            seed: whole number SEED_RANGE
            steps: whole number STEPS_RANGE: sigma points including the terminal one
            duration: number, seconds: DURATION_RANGE
            height: whole number, pixels: CANVAS_RULE (0: default)
            width: whole number, pixels: CANVAS_RULE (0: default)
            alpha_a: text: A's alpha, a number ALPHA_RANGE, or auto
            scale_a: number SCALE_RANGE: A's scale
            alpha_b: text: B's alpha, a number ALPHA_RANGE, or auto
            scale_b: number SCALE_RANGE: B's scale
            adapters_json: ADAPTERS_JSON (the first adapter is checked)
            token: text: a Hugging Face token (empty: none)
        Returns:
            the `check --json` object: identical, control_identical, hashes, max |A-B|, effective scales
        """
        try:
            adapters = _adapters(session, adapters_json)
        except H3AppError as error:
            raise user_error(error) from error
        form = JobForm(_probe(adapters), None, RequestForm(prompt=prompt, seed=seed, steps=steps, duration=duration,
                                                           height=height, width=width), token)
        result = self.comparisons.check(form, CheckForm(alpha_a, scale_a, alpha_b, scale_b), request, progress)
        if isinstance(result, Stopped):
            raise gr.Error("the equivalence check was cancelled.", print_exception=False)
        return result.to_json()

    def grid(self, session: Session | None, prompt: str, steps: float, duration: float, height: float,
             width: float, alphas: str, scales: str, seeds: str, adapters_json: str, token: str,
             request: gr.Request | None = None, progress: Any = gr.Progress()) -> Iterator[list[dict[str, Any]]]:
        """Sweep alpha x scale x seed with the first adapter; streams the cells as they finish, each with its
        distance to the same request without the LoRA.

        Parameters:
            prompt: text: the request's prompt (PROMPT_RULE)
            steps: whole number STEPS_RANGE: sigma points including the terminal one
            duration: number, seconds: DURATION_RANGE
            height: whole number, pixels: CANVAS_RULE (0: default)
            width: whole number, pixels: CANVAS_RULE (0: default)
            alphas: text: comma-separated alphas, each ALPHA_RANGE or auto (the file's own chain); GRID_CELLS
            scales: text: comma-separated scales, each SCALE_RANGE
            seeds: text: comma-separated whole numbers, each SEED_RANGE
            adapters_json: ADAPTERS_JSON (the first adapter is swept)
            token: text: a Hugging Face token (empty: none)
        Returns:
            a growing list of cells: {alpha, strength, seed, hash, baseline_psnr, baseline_max_abs_diff, seconds}
        """
        try:
            adapters = _adapters(session, adapters_json)
        except H3AppError as error:
            raise user_error(error) from error
        form = JobForm(_probe(adapters), None, RequestForm(prompt=prompt, steps=steps, duration=duration,
                                                           height=height, width=width), token)
        cells: list[dict[str, Any]] = []
        for cell in self.comparisons.grid_cells(form, GridForm(alphas, scales, seeds), request, progress):
            cells.append(cell.to_json())
            yield list(cells)
        if not cells:
            yield []


def api_doc(function: Any, limits: Any, hosted: bool) -> str:
    """``function``'s docstring with the ranges of the rules that check each parameter filled in (what the API
    page shows): the held model's ``limits``, ``rules.values`` and the ``adapters_json`` schema."""
    return fill(function.__doc__ or "", limits, hosted)


def api_words(limits: Any, hosted: bool) -> dict[str, str]:
    """The range words of the API page: the held model's ``limits``, ``rules.values`` and the adapters schema."""
    rule = limits.frames
    return {
        "STEPS_RANGE": f"{limits.min_steps} to {limits.max_steps}" + ("" if hosted else
                                                                       f" ({HOSTED_MAX_STEPS} on a hosted server)"),
        "DURATION_RANGE": rule.describe(), "SEED_RANGE": f"0 to {MAX_SEED}",
        "CANVAS_RULE": (f"a multiple of {limits.canvas_multiple}, height × width at most {limits.max_pixels:,} "
                        f"pixels"),
        "ALPHA_RANGE": ALPHA.describe(), "SCALE_RANGE": STRENGTH.describe(), "TEXT_CHARS": f"{MAX_FIELD_CHARS:,}",
        "PROMPT_RULE": f"not empty, at most {limits.max_prompt_tokens:,} tokens",
        "GRID_CELLS": f"alphas × scales × seeds at most {limits.max_grid_cells} cells",
        "ADAPTERS_JSON": adapters_json_words(),
        "ADVANCED_PARAMETERS": advanced_parameter_lines(),
    }


def fill(text: str, limits: Any, hosted: bool) -> str:
    """``text`` with each range word (STEPS_RANGE, ADAPTERS_JSON, …) replaced by the rule's own words."""
    words = api_words(limits, hosted)
    return re.sub("|".join(words), lambda match: words[match.group(0)], text)


# What the API page shows beside each parameter (the hidden inputs' labels), from the rule that checks it.
API_LABELS = {
    "source": "adapter source: Hub repo id, HF URL or local path (text, at most TEXT_CHARS characters)",
    "alpha": "alpha: a number ALPHA_RANGE, or auto (the file's own)",
    "scale": "scale (strength): a number SCALE_RANGE",
    "prompt": "prompt: text, PROMPT_RULE",
    "adapters_json": "adapters_json: ADAPTERS_JSON",
    "alpha_a": "A: alpha, a number ALPHA_RANGE, or auto", "alpha_b": "B: alpha, a number ALPHA_RANGE, or auto",
    "scale_a": "A: scale, SCALE_RANGE", "scale_b": "B: scale, SCALE_RANGE",
    "alphas": "alphas, comma-separated: each ALPHA_RANGE or auto; GRID_CELLS",
    "scales": "scales, comma-separated: each SCALE_RANGE", "seeds": "seeds, comma-separated: each SEED_RANGE",
    "seed": "seed: a whole number SEED_RANGE", "steps": "steps: a whole number STEPS_RANGE (N steps run N-1 "
                                                       "evaluations)",
    "duration": "duration in seconds, DURATION_RANGE",
    "height": "height in pixels: CANVAS_RULE (0: the model's default)",
    "width": "width in pixels: CANVAS_RULE (0: the model's default)",
    "shift": "video flow shift: a number > 0 (0: the model's default)",
    "audio_shift": "audio flow shift: a number > 0 (0: the model's default)",
    **{knob.name: api_label(knob) for knob in KNOBS},
}


def documented(function: Callable[..., Any], doc: str) -> Callable[..., Any]:
    """``function`` (a bound method; a generator stays a generator) under its own docstring ``doc``."""
    if inspect.isgeneratorfunction(function):
        @functools.wraps(function)
        def stream(*args: Any, **kwargs: Any) -> Iterator[Any]:
            yield from function(*args, **kwargs)
        stream.__doc__ = doc
        return stream

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)
    call.__doc__ = doc
    return flattened(call, function)


def _adapters(session: Session | None, adapters_json: str | None) -> list[LoRASettings]:
    """The adapters a job carries: the explicit JSON when given, else the session's."""
    explicit = parse_adapters_json(adapters_json)
    return job_adapters(session) if explicit is None else explicit


def _probe(adapters: list[LoRASettings]) -> Session:
    """A session value holding exactly ``adapters`` (the comparison events read adapters from a session)."""
    return Session(adapters={str(i + 1): a for i, a in enumerate(adapters)})


def build_api(events: ApiEvents, session: gr.State) -> None:
    """Hidden inputs and trigger buttons for the named endpoints (inside the current Blocks context). Each input's
    label is what the API page shows beside the parameter's name."""
    backend = events.adapters.backend
    defaults = backend.defaults  # the held model's request defaults, as the UI's controls show them
    gpu = gpu_events(backend)
    endpoint = {name: documented(getattr(events, name), api_doc(getattr(ApiEvents, name), backend.limits,
                                                                backend.hosted))
                for name in ("inspect", "load", "set_lora", "generate", "check_equivalence", "grid")}
    gpu_fn = {name: admitted(endpoint[name], backend) for name in ("load", "generate", "check_equivalence", "grid")}
    with gr.Column(visible=False):
        text = {name: gr.Textbox(value=value, label=label, elem_id=f"api-{name}") for name, value, label in (
            ("source", "", "adapter source: Hub repo id, HF URL or local path"),
            ("weight_name", "", "weight file name (empty: the only one)"),
            ("revision", "", "branch, tag or commit (empty: main)"),
            ("token", "", "Hugging Face token (empty: none)"), ("alpha", "auto", "alpha: a number, or auto"),
            ("mode", UNMERGED, f"LoRA mode: {' or '.join(LORA_MODES)}"),
            ("prompt", defaults.prompt, "prompt"),
            ("workflow", T2VA, "workflow: t2va, fl2va or ref2va"),
            ("adapters_json", "", "adapters as JSON (empty: this session's)"),
            ("alpha_a", f"{DEFAULT_A.alpha:g}", "A: alpha (a number, or auto)"),
            ("alpha_b", f"{DEFAULT_B.alpha:g}", "B: alpha (a number, or auto)"),
            ("alphas", defaults.grid.alphas, "alphas, comma-separated (auto allowed)"),
            ("scales", defaults.grid.scales, "scales, comma-separated"),
            ("seeds", defaults.grid.seeds, "seeds, comma-separated"))}
        number = {name: gr.Number(value=value, label=label, elem_id=f"api-{name}") for name, value, label in (
            ("slot", 1, "adapter slot: 1 or 2"), ("scale", 1.0, "scale (strength)"), ("seed", defaults.seed, "seed"),
            ("steps", defaults.steps, "steps (N steps run N-1 evaluations)"),
            ("duration", defaults.duration, f"duration in seconds, {RELEASED.describe()}"),
            ("height", 0, "height in pixels (0: default)"), ("width", 0, "width in pixels (0: default)"),
            ("shift", 0, "video flow shift (0: default)"), ("audio_shift", 0, "audio flow shift (0: default)"),
            ("scale_a", DEFAULT_A.strength, "A: scale"), ("scale_b", DEFAULT_B.strength, "B: scale"))}
        knobs = knob_inputs()  # one hidden input per advanced strength: the last parameters of /load and /set_lora
        enabled = gr.Checkbox(value=True, label="enabled (false removes the slot's adapter)")
        first_frame = gr.File(label="first keyframe image (fl2va)", type="filepath")
        last_frame = gr.File(label="last keyframe image (fl2va)", type="filepath")
        references = gr.File(label="references: images, videos or audio (ref2va)", file_count="multiple",
                             type="filepath")
        result = {name: gr.JSON(label=label) for name, label in (
            ("inspect", "inspect --json, plus weight_files"), ("load", "slot, settings, match report, provenance"),
            ("set_lora", "this session's adapters"), ("generate", "generate --json, with the run's settings"),
            ("check_equivalence", "check --json: identical, control, hashes, effective scales"),
            ("grid", "grid cells so far"))}
        video = gr.Video(label="mp4 with stereo audio")
    for name, words in API_LABELS.items():  # the ranges beside each parameter on the API page
        (text.get(name) or number.get(name) or knobs[name]).label = fill(words, backend.limits, backend.hosted)
    with gr.Column(visible=False):
        buttons = {name: gr.Button(name) for name in ("inspect", "load", "set_lora", "generate",
                                                       "check_equivalence", "grid")}

    buttons["inspect"].click(endpoint["inspect"], [text["source"], text["weight_name"], text["revision"], text["token"]],
                             [result["inspect"]], api_name="inspect", concurrency_id="inspect", concurrency_limit=4)
    advanced = list(knobs.values())
    buttons["load"].click(gpu_fn["load"], [session, number["slot"], text["source"], text["weight_name"],
                                        text["revision"], text["alpha"], number["scale"], text["mode"], text["token"],
                                        *advanced],
                          [session, result["load"]], api_name="load", **gpu)
    buttons["set_lora"].click(endpoint["set_lora"], [session, number["slot"], text["alpha"], number["scale"], text["mode"],
                                                text["source"], text["weight_name"], text["revision"], enabled,
                                                *advanced],
                              [session, result["set_lora"]], api_name="set_lora", queue=False)
    buttons["generate"].click(gpu_fn["generate"], [session, text["prompt"], number["seed"], number["steps"],
                                                number["duration"], number["height"], number["width"],
                                                number["shift"], number["audio_shift"], text["workflow"], first_frame,
                                                last_frame, references, text["adapters_json"], text["token"]],
                              [video, result["generate"]], api_name="generate", **gpu)
    buttons["check_equivalence"].click(
        gpu_fn["check_equivalence"], [session, text["prompt"], number["seed"], number["steps"], number["duration"],
                                   number["height"], number["width"], text["alpha_a"], number["scale_a"],
                                   text["alpha_b"], number["scale_b"], text["adapters_json"], text["token"]],
        [result["check_equivalence"]], api_name="check_equivalence", **gpu)
    buttons["grid"].click(gpu_fn["grid"], [session, text["prompt"], number["steps"], number["duration"],
                                         number["height"], number["width"], text["alphas"], text["scales"],
                                         text["seeds"], text["adapters_json"], text["token"]],
                          [result["grid"]], api_name="grid", **gpu)
