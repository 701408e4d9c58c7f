"""Generate tab events: build the request, run it as a worker job with per-step progress and a real Cancel,
show the result and its reproduction (settings JSON, h3app/sglang commands, diffusers snippet), load settings
back from a JSON or an mp4, presets and trigger words from the known-adapter card."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gradio as gr

from ..adapters.resolved import resolve_adapter
from ..adapters.summary import AdapterSummary, applied_lines, describe
from ..backend import media
from ..backend.generation import Cancelled, GenerationRequest
from ..errors import H3AppError
from ..rules.choices import FL2VA, REF2VA, T2VA, WORKFLOWS
from ..rules.frames import RELEASED
from ..rules.steps import evaluations
from . import history_words, render, snippets
from .adapter_events import user_error
from .client_gone import client_gone
from .forms import KEEP, JobForm, RequestForm, SlotForm, SyncForm
from .session import RunningJobs, add_history, job_adapters, session_key

MAX_SEED = 2**31 - 1


@dataclass(frozen=True)
class Stopped:
    """A job that was cancelled (by its Cancel button, or because its browser went away): the line to show."""

    status: str


class JobRunner:
    """Submit a worker job, forward its progress to ``gr.Progress``, let the session's Cancel stop it."""

    def __init__(self, backend: Any, jobs: RunningJobs) -> None:
        self.backend = backend
        self.jobs = jobs

    def run(self, submit: Callable[[], Any], request: Any, progress: Any, what: str) -> Any:
        """``submit()`` → JobHandle; wait for it. Returns the job's result, or :class:`Stopped` when it was
        cancelled (a toast and the tab's status say after how many steps). Other user errors become ``gr.Error``."""
        key = session_key(request)
        abandoned = client_gone()
        if self.jobs.start(key):
            return self.stopped(what, "cancelled before it started.")
        try:
            handle = submit()
        except H3AppError as error:
            raise user_error(error) from error
        phase = [what]

        def on_step(done: int, total: int) -> None:
            if progress is None:
                return
            if done == total and phase[0] in (what, "denoising"):
                progress(None, desc=f"{what}: {total}/{total} steps done — decoding video and audio")
            else:
                progress((done, total), desc=f"{phase[0]}: step {done}/{total}", unit="steps")

        def on_phase(name: str) -> None:
            phase[0] = describe_phase(what, name)
            if progress is not None:
                progress(None, desc=phase[0])

        try:
            with self.jobs.track(key, handle):
                return self.backend.run(handle, on_step, on_phase, abandoned)
        except Cancelled as error:
            return self.stopped(what, str(error))
        except H3AppError as error:
            raise user_error(error) from error

    @staticmethod
    def stopped(what: str, reason: str) -> Stopped:
        gr.Warning(f"{what} {reason}")
        return Stopped(f"**{reason[:1].upper()}{reason[1:]}** ({what}) The result shown is from the previous run.")

    def expect(self, request: gr.Request = None) -> None:
        """A job was clicked: until it starts, Cancel stops it before it runs."""
        self.jobs.expect(session_key(request))

    def abandon(self, request: gr.Request = None) -> None:
        """The session's browser went away (tab closed or reloaded): its job stops at its next step."""
        self.jobs.cancel(session_key(request))

    def cancel(self, request: gr.Request = None) -> str:
        """Stop this session's running job at its next denoising step (or before it starts, when still queued)."""
        label = self.jobs.cancel(session_key(request))
        if label is None:
            return "Nothing of yours is running."
        return f"Cancelling **{label}**: it stops at its next step; the model is left unchanged."


EQUIVALENCE_RUNS = {"A": "A", "control": "determinism control (A's first step, twice)", "B": "B",
                    "fallback": "fallback (alpha = rank)"}


def describe_phase(what: str, phase: str) -> str:
    """The progress line for a backend phase: the equivalence check's runs ("B (4/4)") named in full."""
    label, _, count = phase.partition(" (")
    if label in EQUIVALENCE_RUNS and count:
        return f"{what} · run {count.rstrip(')')}: {EQUIVALENCE_RUNS[label]}"
    return f"{what} · {phase}"


class GenerateEvents:
    """Event functions of the Generate tab, bound to one backend."""

    def __init__(self, backend: Any, jobs: RunningJobs) -> None:
        self.backend = backend
        self.runner = JobRunner(backend, jobs)

    def generate(self, request: GenerationRequest, adapters: Sequence[Any], token: str | None, http_request: Any,
                 progress: Any) -> Any:
        """Run one generation; the GenerationOutput, or Stopped when cancelled."""
        return self.runner.run(lambda: self.backend.submit_generate(request, adapters, token or None), http_request,
                               progress, "generation")

    def generate_view(self, form: JobForm, infos: Sequence[Mapping[str, Any] | None] = (),
                      request: gr.Request = None, progress: Any = gr.Progress()) -> GenerateView | Stopped:
        """Generate with the session's adapters (``infos``: each slot's inspect JSON, for the sglang notes)."""
        used_seed = random.randint(0, MAX_SEED) if form.request.randomize else None
        try:
            generation = form.request.to_request(used_seed)
            adapters = job_adapters(form.session, form.mode)
        except H3AppError as error:
            raise user_error(error) from error
        output = self.generate(generation, adapters, form.token, request, progress)
        if isinstance(output, Stopped):
            return output
        summary = output.to_json()
        settings = {**output.settings, "result": {k: v for k, v in summary.items() if k not in ("adapters", "out")},
                    "applied": applied_lines(output.settings.get("adapters") or ())}
        sglang = reproduction_views(settings, list(infos)[:len(adapters)])
        label = history_words.entry_label({"kind": "generate", "settings": output.settings})
        session = add_history(form.session, {"kind": "generate", "label": label, "video": output.video_path,
                                             "thumbnail": output.thumbnail_path, "hash": summary["hash"],
                                             "settings": output.settings})
        return GenerateView(video=output.video_path, seed=generation.seed, settings_json=settings,
                            result_html=render.result_html(summary), h3app_command=sglang.h3app_command,
                            sglang_command=sglang.sglang_command, sglang_notes=sglang.sglang_notes,
                            diffusers_snippet=sglang.diffusers_snippet, session=session)


@dataclass(frozen=True)
class Reproduction:
    """How to reproduce a run: the h3app command, the sglang command and its notes card, a diffusers snippet."""

    h3app_command: str
    sglang_command: str
    sglang_notes: str
    diffusers_snippet: str


@dataclass(frozen=True)
class GenerateView(Reproduction):
    """A finished generation: the video, the seed used (written back), its settings JSON and result card."""

    video: str = ""
    seed: int = 0
    settings_json: dict[str, Any] = field(default_factory=dict)
    result_html: str = ""
    session: dict[str, Any] = field(default_factory=dict)


def reproduction_views(settings: Mapping[str, Any], infos: Sequence[Mapping[str, Any] | None] = ()
                       ) -> Reproduction:
    """How to reproduce a run from its settings JSON."""
    sglang = snippets.sglang_command(settings, list(infos))
    if sglang.notes:
        notes = render.card("warn", "<b>sglang would differ:</b><ul>"
                                    + "".join(f"<li>{render.esc(n)}</li>" for n in sglang.notes) + "</ul>",
                            testid="sglang-notes")
    else:
        notes = render.card("ok", "sglang with these flags applies the same alpha and scale.", testid="sglang-notes")
    return Reproduction(snippets.h3app_command(settings), sglang.command, notes, snippets.diffusers_snippet(settings))


# ---------------------------------------------------------------------------------------------- load settings
def read_settings_file(path: str | None) -> dict[str, Any]:
    """The settings JSON of a previous run: from an mp4 this app wrote, or a .json file."""
    if not path:
        raise H3AppError("no file given: upload a settings .json or an .mp4 made by this app.")
    file = Path(str(getattr(path, "name", path)))
    try:
        if file.suffix.lower() == ".mp4":
            data = media.read_settings(file)
            if data is None:
                raise H3AppError(f"{file.name} carries no h3app settings: use an mp4 made by this app.")
        else:
            data = json.loads(file.read_text(encoding="utf-8"))
    except H3AppError:
        raise
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise H3AppError(f"could not read settings from {file.name} ({type(error).__name__}): upload the .json "
                         f"this app showed, or an mp4 it made.") from error
    if not isinstance(data, dict) or not isinstance(data.get("request"), dict):
        raise H3AppError(f"{file.name} has no \"request\" settings: upload the .json this app showed, or an mp4 it "
                         f"made.")
    return data


def settings_to_controls(data: Mapping[str, Any]) -> dict[str, Any]:
    """Control values from a settings JSON: request fields, and per slot source/weight/revision/override/alpha/scale
    (revision pinned to the commit the file came from, when known)."""
    request = data["request"]
    adapters = list(data.get("adapters") or ([data["adapter"]] if data.get("adapter") else []))
    controls: dict[str, Any] = {
        "workflow": request.get("workflow", T2VA), "prompt": request.get("prompt", ""),
        "seed": request.get("seed", 0), "steps": request.get("steps", 5), "duration": request.get("duration", RELEASED.shortest_seconds),
        "height": request.get("height"), "width": request.get("width"), "shift": request.get("shift"),
        "audio_shift": request.get("audio_shift"),
        "mode": adapters[0].get("mode", "unmerged") if adapters else "unmerged",
    }
    for slot in ("1", "2"):
        index = int(slot) - 1
        adapter = adapters[index] if index < len(adapters) else None
        controls[f"slot{slot}"] = None if adapter is None else {
            "source": adapter.get("source", ""), "weight_name": adapter.get("weight_name"),
            "revision": adapter.get("commit") or adapter.get("revision") or "",
            "override": adapter.get("alpha") is not None, "alpha": adapter.get("alpha"),
            "strength": float(adapter.get("strength", 1.0)),
        }
    return controls


@dataclass(frozen=True)
class SettingsView:
    """Controls restored from a settings file: the request, the LoRA mode, each slot (None: emptied) and a status
    line naming inputs that must be uploaded again."""

    request: RequestForm
    mode: str
    slots: Mapping[str, SlotForm | None]
    load_status: str


def load_settings_view(path: str | None) -> SettingsView:
    """Read a settings .json or an mp4 made here into the controls' values."""
    try:
        data = read_settings_file(path)
        controls = settings_to_controls(data)
    except H3AppError as error:
        raise user_error(error) from error
    request = RequestForm(**{name: controls[name] for name in ("workflow", "prompt", "seed", "steps", "duration",
                                                               "height", "width", "shift", "audio_shift")})
    slots: dict[str, SlotForm | None] = {}
    for slot in ("1", "2"):
        adapter = controls[f"slot{slot}"]
        slots[slot] = None if adapter is None else SlotForm(
            source=adapter["source"], weight=adapter["weight_name"], revision=adapter["revision"],
            override=adapter["override"], alpha="" if adapter["alpha"] is None else f"{float(adapter['alpha']):g}",
            strength=adapter["strength"])
    missing = [k for k in ("first_frame", "last_frame") if data["request"].get(k)]
    if data["request"].get("references"):
        missing.append("references")
    status = "Settings restored" + (f" — upload these again: {', '.join(missing)}." if missing else ".")
    return SettingsView(request, controls["mode"], slots, status)


# ------------------------------------------------------------------------------------- what a run applies
APPLY_NOTE_EMPTY = "Generate runs the **base model** (no adapter in the panel)."


def refusal_status(form: SyncForm) -> str:
    """Why a job did not start: each slot whose controls are refused, in one line each."""
    lines = []
    for name, slot in sorted(form.slots.items()):
        try:
            slot.settings(form.mode)
        except H3AppError as error:
            lines.append(f"✖ Not run — adapter {name}: {error}")
    return "  \n".join(lines) or "✖ Not run: see the message."


def apply_note(form: SyncForm) -> str:
    """What the next Generate, Equivalence check or Grid applies: the panel's adapters as they stand — Load is not
    required (a job fetches and binds what the panel shows), but this says so before the run."""
    lines = []
    for name, slot in sorted(form.slots.items()):
        if not slot.source or not str(slot.source).strip():
            continue
        if slot.refused:
            lines.append(f"✖ adapter {name} is refused: {slot.refused}")
            continue
        try:
            settings = slot.settings(form.mode)
        except H3AppError as error:
            lines.append(f"⚠ adapter {name}: {error}")
            continue
        loaded = ((form.session or {}).get("adapters") or {}).get(name) or {}
        same_file = all(loaded.get(k) == getattr(settings, k) for k in ("source", "weight_name", "revision"))
        state = ("loaded" if same_file else
                 "**not loaded yet**: the run fetches and binds it first (Load shows its match report beforehand)")
        lines.append(f"Generate applies **adapter {name}**: `{Path(settings.source).name}` at "
                     f"{applied_words(slot, settings)} — {state}.")
    return "  \n".join(lines) if lines else APPLY_NOTE_EMPTY


def applied_words(slot: SlotForm, settings: Any) -> str:
    """What the slot will apply, in the one summary's words when Inspect has read the file (``alpha 1 (registry)
    × scale 1 → effective 0.0625``), else the settings as given (``alpha 8 × scale 1``; auto: the file's chain)."""
    info = slot.info or {}
    if info.get("resolved") is not None and (info.get("adapter") or [None])[0] == slot.source_to_read:
        # the settings passed SlotForm's checks, which are the resolver's: it cannot refuse them here
        return describe(AdapterSummary.of(resolve_adapter(info, settings.alpha, settings.strength)))
    alpha = "auto (the file's chain)" if settings.alpha is None else f"{settings.alpha:g}"
    return f"alpha {alpha} × scale {settings.strength:g}"


# ---------------------------------------------------------------------------------------- presets and prompts
def request_problem(form: RequestForm, limits: Any) -> str | None:
    """The one-line refusal of the request's numbers as they stand (seed, steps, duration, canvas, shifts), by
    the rules a job is checked with (``GenerationRequest``, the held model's ``Limits``); None when they pass. The
    prompt and the workflow's input files are judged when a job starts."""
    numbers = replace(form, prompt="-", workflow=T2VA, first_frame=None, last_frame=None, references=())
    try:
        request = numbers.to_request()
        limits.check_canvas(request.height, request.width)
        limits.check_steps(request.steps)
        limits.frames.check_duration(request.duration)
    except H3AppError as error:
        return str(error)
    return None


def request_note(form: RequestForm, limits: Any, info: Mapping[str, Any] | None) -> str:
    """The line under the request's numbers: a refused value in one line (nothing is clamped; Generate,
    Equivalence and Grid refuse it the same way), else what the steps mean (:func:`steps_note`)."""
    problem = request_problem(form, limits)
    if problem is not None:
        return f"**✖ Not applied:** {problem}"
    return steps_note(form.steps, info)


def steps_note(steps: float, info: Mapping[str, Any] | None) -> str:
    """N steps → N−1 transformer evaluations, and a warning when a known distilled adapter wants another count."""
    steps = int(steps)
    text = (f"**{steps} steps → {evaluations(steps)} transformer evaluations** (steps count sigma points including "
            "the terminal one).")
    known = (info or {}).get("known") or {}
    if known.get("steps") and int(known["steps"]) != steps:
        text += (f"  \n⚠ {known.get('title', 'this adapter')} was made for **{int(known['steps'])} steps** "
                 f"({evaluations(known['steps'])} evaluations): use *Apply preset*.")
    return text


def with_trigger(prompt: str | None, info: Mapping[str, Any] | None) -> str:
    """The prompt with the known adapter's trigger word in front (unchanged if it is already there or unknown)."""
    trigger = ((info or {}).get("known") or {}).get("trigger")
    prompt = prompt or ""
    if not trigger or trigger.lower() in prompt.lower():
        return prompt
    return f"{trigger}, {prompt}" if prompt else trigger


def trigger_button(info: Mapping[str, Any] | None) -> dict[str, Any]:
    trigger = ((info or {}).get("known") or {}).get("trigger")
    label = f"Add trigger word “{trigger}”" if trigger else "Add trigger word"
    return gr.update(visible=bool(trigger), value=label)


@dataclass(frozen=True)
class PresetView:
    """A known adapter's recommended settings (KEEP where the registry gives none: that control stays)."""

    strength: Any
    steps: Any
    shift: Any
    audio_shift: Any
    workflow: Any
    prompt: str
    override: Any = KEEP
    alpha: Any = KEEP


def apply_preset(info: Mapping[str, Any] | None, prompt: str | None) -> PresetView:
    """The known adapter's recommended scale, steps, shifts and workflow, and the prompt with its trigger word."""
    known = (info or {}).get("known")
    if not known:
        raise gr.Error("this adapter is not in the registry of known adapters: there is no preset to apply.",
                       print_exception=False)

    def value(key: str) -> Any:
        return known[key] if known.get(key) is not None else KEEP

    workflow = known["workflow"] if known.get("workflow") in WORKFLOWS else KEEP
    # the alpha its chip shows: auto when the chain already gives it (or the author says alpha = rank), else set
    chain = (info or {}).get("alpha")
    if known.get("alpha") is not None and chain != float(known["alpha"]):
        override, alpha = True, f"{float(known['alpha']):g}"
    else:
        override, alpha = False, (f"{float(chain):g}" if chain is not None else "")
    gr.Info(f"preset of {known.get('title', 'the adapter')} applied")
    return PresetView(value("scale"), value("steps"), value("shift"), value("audio_shift"), workflow,
                      with_trigger(prompt, info), override, alpha)


@dataclass(frozen=True)
class WorkflowInputs:
    """Which of the workflow's own inputs are shown: the keyframe row and the reference uploads."""

    keyframes: Any
    references: Any


def workflow_inputs(workflow: str) -> WorkflowInputs:
    """Show keyframe uploads for fl2va and reference uploads for ref2va."""
    return WorkflowInputs(gr.update(visible=workflow == FL2VA), gr.update(visible=workflow == REF2VA))
