"""Named API endpoints for ``gradio_client``: ``/inspect``, ``/load``, ``/set_lora``, ``/generate``,
``/check_equivalence``, ``/grid``.

They take plain, typed parameters (hidden components, so the UI's own events stay private) and return JSON.
``/load`` and ``/set_lora`` edit the calling session's adapter settings (a ``gr.State``; a ``Client`` keeps its
session between calls) for its next job; ``/generate``, ``/check_equivalence`` and ``/grid`` use those settings,
or — for clients without a session — the adapters given explicitly as JSON (docs/architecture.md, decision 7).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr

from ..backend.limits import HOSTED_MAX_STEPS, MAX_STEPS
from ..errors import H3AppError
from ..rules.check_pair import DEFAULT_A, DEFAULT_B
from ..rules.choices import T2VA
from ..rules.frames import RELEASED
from ..rules.steps import MIN_STEPS
from ..settings import LoRASettings
from .adapter_events import AdapterEvents, user_error
from .comparison_events import ComparisonEvents
from .endpoint_guard import public_report
from .fair_queue import admitted, gpu_events
from .forms import CheckForm, GridForm, JobForm, RequestForm
from .generate_events import GenerateEvents, Stopped
from .session import check_slot, job_adapters, parse_adapters_json, settings_from_json, settings_to_json, with_adapter


class ApiEvents:
    """The functions behind the named endpoints. Their docstrings are what the app's API page shows: plain text
    (the ranges are filled in from ``rules.frames`` and ``backend.limits`` below the class)."""

    def __init__(self, adapters: AdapterEvents, generate: GenerateEvents, comparisons: ComparisonEvents) -> None:
        self.adapters = adapters
        self.generate_events = generate
        self.comparisons = comparisons

    def inspect(self, source: str, weight_name: str, revision: str, token: str) -> dict[str, Any]:
        """Read an adapter's header only (nothing is downloaded): format, rank, targets, alpha and where it comes
        from, match against this model, and the weight files of its repo or folder with their sizes.

        Parameters:
            source: a Hub repo id (owner/name), an HF URL or a local path
            weight_name: the .safetensors file in the repo or folder (empty when there is only one)
            revision: branch, tag or commit (empty: main)
            token: a Hugging Face token for private or gated repos (empty: none)
        Returns:
            the same object as `python -m h3app inspect --json`, plus weight_files: a list of {name, size}
        """
        info = self.adapters.inspect(source, weight_name or None, revision or None, token or None)
        try:
            files = self.adapters.backend.list_weights(source.strip(), revision or None, token or None)
        except H3AppError as error:
            raise user_error(error) from error
        return {**info, "weight_files": [{"name": f.name, "size": f.size} for f in files]}

    def load(self, session: dict[str, Any] | None, slot: float, source: str, weight_name: str, revision: str,
             alpha: str, scale: float, mode: str, token: str, request: gr.Request = None,
             progress: Any = gr.Progress()) -> tuple[dict[str, Any], dict[str, Any]]:
        """Download only the pinned weight file, bind it to the model and make it this session's adapter in
        slot 1 or 2 (the next /generate, /check_equivalence and /grid of this client use it).

        Parameters:
            slot: 1 or 2
            source: a Hub repo id, an HF URL or a local path
            weight_name: the .safetensors file (empty when there is only one)
            revision: branch, tag or commit (empty: main)
            alpha: a number, or auto (the file's own alpha chain)
            scale: the strength multiplier (1.0 = as trained; negative pushes the other way)
            mode: unmerged (exact, free alpha/scale changes) or merged (faster steps)
            token: a Hugging Face token (empty: none)
        Returns:
            {slot, settings, report (matched/unmatched keys), provenance (commit, sha256, alpha source), summary}
        """
        try:
            slot_name = check_slot(slot)
            settings = settings_from_json({"source": source, "weight_name": weight_name, "revision": revision,
                                           "alpha": alpha, "strength": scale, "mode": mode or "unmerged"})
        except H3AppError as error:
            raise user_error(error) from error
        session, result = self.adapters.load(session, slot_name, settings, T2VA, token, request, progress)
        name = result.provenance.get("weight_name") or Path(settings.source).name
        return session, {"slot": slot_name, "settings": session["adapters"][slot_name],
                         "report": public_report(result.report.to_json(), name), "provenance": result.provenance,
                         "summary": result.report.summary()}

    def set_lora(self, session: dict[str, Any] | None, slot: float, alpha: str, scale: float, mode: str,
                 source: str, weight_name: str, revision: str, enabled: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        """Edit this session's adapter in slot 1 or 2 for its next job; nothing runs and nothing is downloaded.

        Parameters:
            slot: 1 or 2
            alpha: a number, or auto
            scale: the strength multiplier
            mode: unmerged or merged
            source: a new adapter for the slot (empty: keep the slot's adapter)
            weight_name: the new adapter's weight file (with source)
            revision: the new adapter's revision (with source)
            enabled: false removes the slot's adapter
        Returns:
            {adapters: slot -> settings} after the edit
        """
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
            current.update({"alpha": alpha, "strength": scale, "mode": mode or current.get("mode") or "unmerged"})
            session = with_adapter(session, slot_name, settings_from_json(current))
        except H3AppError as error:
            raise user_error(error) from error
        return session, {"adapters": session["adapters"]}

    def generate(self, session: dict[str, Any] | None, prompt: str, seed: float, steps: float, duration: float,
                 height: float, width: float, shift: float, audio_shift: float, workflow: str,
                 first_frame: str | None = None, last_frame: str | None = None, references: list[Any] | None = None,
                 adapters_json: str = "", token: str = "", request: gr.Request = None, progress: Any = gr.Progress()
                 ) -> tuple[Any, dict[str, Any]]:
        """Generate one video with stereo audio, with this session's adapters or the ones given in adapters_json.

        Parameters:
            prompt: what the video shows and sounds like
            seed: the random seed (same seed and settings: the same output, bit for bit)
            steps: sigma points including the terminal one (N steps run N-1 transformer evaluations), STEPS_RANGE
            duration: seconds, DURATION_RANGE
            height: pixels (0: the model's default canvas; give width too)
            width: pixels (0: the model's default)
            shift: the video flow shift (0: the model's default)
            audio_shift: the audio flow shift (0: the model's default)
            workflow: t2va (text), fl2va (first/last keyframes) or ref2va (references)
            first_frame: fl2va's first keyframe image
            last_frame: fl2va's last keyframe image
            references: ref2va's reference images, videos or audio
            adapters_json: empty (this session's adapters), [] (none) or a JSON list of {source, alpha, scale}
            token: a Hugging Face token (empty: none)
        Returns:
            the mp4, and the `generate --json` object with the run's full settings
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
        return output.video_path, {**output.to_json(), "settings": output.settings}

    def check_equivalence(self, session: dict[str, Any] | None, prompt: str, seed: float, steps: float,
                          duration: float, height: float, width: float, alpha_a: str, scale_a: float, alpha_b: str,
                          scale_b: float, adapters_json: str, token: str, request: gr.Request = None,
                          progress: Any = gr.Progress()) -> dict[str, Any]:
        """Run the old alpha = rank fallback, A, A's first step again (determinism control) and B through the full
        pipeline with the first adapter, and say whether A and B are bit-identical.

        Parameters:
            prompt: the request's prompt
            seed: the random seed
            steps: sigma points including the terminal one, STEPS_RANGE
            duration: seconds, DURATION_RANGE
            height: pixels (0: default)
            width: pixels (0: default)
            alpha_a: A's alpha (a number, or auto)
            scale_a: A's scale
            alpha_b: B's alpha (a number, or auto)
            scale_b: B's scale
            adapters_json: empty (this session's adapters) or a JSON list of {source, alpha, scale}
            token: a Hugging Face token (empty: none)
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

    def grid(self, session: dict[str, Any] | None, prompt: str, steps: float, duration: float, height: float,
             width: float, alphas: str, scales: str, seeds: str, adapters_json: str, token: str,
             request: gr.Request = None, progress: Any = gr.Progress()) -> Iterator[list[dict[str, Any]]]:
        """Sweep alpha x scale x seed with the first adapter; streams the cells as they finish, each with its
        distance to the same request without the LoRA.

        Parameters:
            prompt: the request's prompt
            steps: sigma points including the terminal one, STEPS_RANGE
            duration: seconds, DURATION_RANGE
            height: pixels (0: default)
            width: pixels (0: default)
            alphas: comma-separated alphas; auto = the file's own chain
            scales: comma-separated scales
            seeds: comma-separated seeds
            adapters_json: empty (this session's adapters) or a JSON list of {source, alpha, scale}
            token: a Hugging Face token (empty: none)
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


def _fill_ranges(function: Any) -> None:
    """Put the accepted ranges into an endpoint's docstring (what the API page shows)."""
    steps = f"{MIN_STEPS} to {MAX_STEPS} ({HOSTED_MAX_STEPS} on a hosted server)"
    function.__doc__ = function.__doc__.replace("DURATION_RANGE", RELEASED.describe()).replace("STEPS_RANGE", steps)


for _endpoint in (ApiEvents.generate, ApiEvents.check_equivalence, ApiEvents.grid):
    _fill_ranges(_endpoint)


def _adapters(session: dict[str, Any] | None, adapters_json: str | None) -> list[LoRASettings]:
    """The adapters a job carries: the explicit JSON when given, else the session's."""
    explicit = parse_adapters_json(adapters_json)
    return job_adapters(session) if explicit is None else explicit


def _probe(adapters: list[LoRASettings]) -> dict[str, Any]:
    """A session value holding exactly ``adapters`` (the comparison events read adapters from a session)."""
    return {"adapters": {str(i + 1): settings_to_json(a) for i, a in enumerate(adapters)}, "history": []}


def build_api(events: ApiEvents, session: gr.State) -> None:
    """Hidden inputs and trigger buttons for the named endpoints (inside the current Blocks context). Each input's
    label is what the API page shows beside the parameter's name."""
    backend = events.adapters.backend
    defaults = backend.defaults  # the held model's request defaults, as the UI's controls show them
    gpu = gpu_events(backend)
    gpu_fn = {name: admitted(getattr(events, name), backend) for name in ("load", "generate", "check_equivalence",
                                                                          "grid")}
    with gr.Column(visible=False):
        text = {name: gr.Textbox(value=value, label=label) for name, value, label in (
            ("source", "", "adapter source: Hub repo id, HF URL or local path"),
            ("weight_name", "", "weight file name (empty: the only one)"),
            ("revision", "", "branch, tag or commit (empty: main)"),
            ("token", "", "Hugging Face token (empty: none)"), ("alpha", "auto", "alpha: a number, or auto"),
            ("mode", "unmerged", "LoRA mode: unmerged or merged"),
            ("prompt", "a red fox running through snow, wind howling", "prompt"),
            ("workflow", T2VA, "workflow: t2va, fl2va or ref2va"),
            ("adapters_json", "", "adapters as JSON (empty: this session's)"),
            ("alpha_a", f"{DEFAULT_A.alpha:g}", "A: alpha (a number, or auto)"),
            ("alpha_b", f"{DEFAULT_B.alpha:g}", "B: alpha (a number, or auto)"),
            ("alphas", defaults.grid.alphas, "alphas, comma-separated (auto allowed)"),
            ("scales", defaults.grid.scales, "scales, comma-separated"),
            ("seeds", defaults.grid.seeds, "seeds, comma-separated"))}
        number = {name: gr.Number(value=value, label=label) for name, value, label in (
            ("slot", 1, "adapter slot: 1 or 2"), ("scale", 1.0, "scale (strength)"), ("seed", defaults.seed, "seed"),
            ("steps", defaults.steps, "steps (N steps run N-1 evaluations)"),
            ("duration", defaults.duration, f"duration in seconds, {RELEASED.describe()}"),
            ("height", 0, "height in pixels (0: default)"), ("width", 0, "width in pixels (0: default)"),
            ("shift", 0, "video flow shift (0: default)"), ("audio_shift", 0, "audio flow shift (0: default)"),
            ("scale_a", DEFAULT_A.strength, "A: scale"), ("scale_b", DEFAULT_B.strength, "B: scale"))}
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
        buttons = {name: gr.Button(name) for name in ("inspect", "load", "set_lora", "generate",
                                                       "check_equivalence", "grid")}

    buttons["inspect"].click(events.inspect, [text["source"], text["weight_name"], text["revision"], text["token"]],
                             [result["inspect"]], api_name="inspect", concurrency_id="inspect", concurrency_limit=4)
    buttons["load"].click(gpu_fn["load"], [session, number["slot"], text["source"], text["weight_name"],
                                        text["revision"], text["alpha"], number["scale"], text["mode"], text["token"]],
                          [session, result["load"]], api_name="load", **gpu)
    buttons["set_lora"].click(events.set_lora, [session, number["slot"], text["alpha"], number["scale"], text["mode"],
                                                text["source"], text["weight_name"], text["revision"], enabled],
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
