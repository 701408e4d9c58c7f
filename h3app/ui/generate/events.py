"""Generate tab events: build the request, run it as a worker job with per-step progress and a real Cancel,
show the result and its reproduction (settings JSON, h3app/sglang commands, diffusers snippet), load settings
back from a JSON or an mp4, presets and trigger words from the known-adapter card."""

from __future__ import annotations

import random
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import gradio as gr

from ...adapters.recipe import run_notes
from ...adapters.summary import applied_lines, not_applied_lines
from ...adapters.training import trigger_word
from ...backend.generation import Cancelled, GenerationRequest
from ...backend.limits import Limits
from ...backend.outputs import GenerationOutput
from ...backend.preview import PreviewBoard, watch
from ...backend.worker import CLIENT_GONE, JobHandle, Progress
from ...errors import H3AppError
from ...hosting.visitors import session_key
from ...rules.choices import FL2VA, REF2VA, T2VA, WORKFLOWS
from ...rules.request_defaults import SEED
from ...rules.steps import evaluations
from ...settings import LoRASettings
from ..forms import KEEP, JobForm, RequestForm
from ..gradio_compat import client_gone
from ..presenters import history_words, render, snippets
from ..presenters.visitor_words import visitor_text
from ..session import RunningJobs, Session, add_history, job_adapters
from ..user_error import user_error
from .apply_note import (  # noqa: F401  (the Generate tab's events: callers import them from here)
    APPLY_NOTE_EMPTY,
    NOT_RUN,
    REQUEST_REFUSED,
    applied_words,
    apply_note,
    refusal_status,
    slot_problem,
    stale_refusals,
)
from .estimates import estimator_for

if TYPE_CHECKING:
    from ...backend.service import Backend

# A drawn seed stays below 2**53 so that the browser's number box (a JavaScript double) shows it exactly.
RANDOM_SEED_TOP = 2**31 - 1


@dataclass(frozen=True)
class Stopped:
    """A job that was cancelled (by its Cancel button, or because its browser went away): the line to show."""

    status: str

    def after(self, session: Session | None, kind: str) -> Stopped:
        """The line, saying that the tab still shows the previous result when this session made one of ``kind``
        (the start of a history entry's kind: ``generate``, ``check``); nothing is claimed for a first run."""
        shown = any(entry.kind.startswith(kind) for entry in (session.history if session is not None else ()))
        return replace(self, status=self.status + " The result shown is from the previous run.") if shown else self


class JobRunner:
    """Submit a worker job, forward its progress to ``gr.Progress``, let the session's Cancel stop it."""

    def __init__(self, backend: Backend, jobs: RunningJobs) -> None:
        self.backend = backend
        self.jobs = jobs

    def run(self, submit: Callable[[], JobHandle], request: gr.Request | None, progress: gr.Progress | None,
            what: str) -> Any:
        """``submit()`` → JobHandle; wait for it. Returns the job's result, or :class:`Stopped` when cancelled (a
        toast and the tab's status say after how many steps). Other user errors become ``gr.Error``."""
        key, handle, abandoned = self._begin(submit, request, what)
        if isinstance(handle, Stopped):
            return handle
        try:
            with self.jobs.track(key, handle):
                return self.backend.run(handle, *_reporters(progress, what), abandoned)
        except Cancelled as error:
            return self.stopped(what, str(error))
        except H3AppError as error:
            raise user_error(error) from error

    def stream(self, submit: Callable[[], JobHandle], request: gr.Request | None, progress: gr.Progress | None,
               what: str, board: PreviewBoard) -> Generator[Progress, None, Any]:
        """:meth:`run` for a generator event: yields the job's progress whenever it or ``board`` (its previews)
        changed; returns what :meth:`run` returns. Closing it (the client went away) cancels the job."""
        key, handle, abandoned = self._begin(submit, request, what)
        if isinstance(handle, Stopped):
            return handle
        on_step, on_phase = _reporters(progress, what)
        try:
            with self.jobs.track(key, handle):
                last = None
                for now in watch(handle, board, abandoned):
                    try:
                        yield now
                    except GeneratorExit:  # nobody reads on: stop at the next step
                        handle.cancel(CLIENT_GONE)
                        raise
                    if last is None or now.phase != last.phase or not now.total:  # a yield clears the bar: redraw
                        on_phase(now.phase if now.phase != "queued" else f"queued (position {now.position})")
                    if now.total:
                        on_step(now.done, now.total)
                    last = now
                return self.backend.run(handle)
        except Cancelled as error:
            return self.stopped(what, str(error))
        except H3AppError as error:
            raise user_error(error) from error

    def _begin(self, submit: Callable[[], JobHandle], request: gr.Request | None,
               what: str) -> tuple[str, JobHandle | Stopped, Callable[[], bool] | None]:
        """(session key, the job's handle — Stopped when Cancel came first —, the client-gone check)."""
        key, abandoned = session_key(request), client_gone()
        if self.jobs.start(key):
            return key, self.stopped(what, "cancelled before it started."), abandoned
        try:
            return key, submit(), abandoned
        except H3AppError as error:
            raise user_error(error) from error

    @staticmethod
    def stopped(what: str, reason: str) -> Stopped:
        """The tab's status line for a stopped job (no pop-up repeats it: the person pressed Cancel and watches
        the tab; a closed tab reads nothing). The caller adds what the tab still shows (:meth:`Stopped.after`)."""
        return Stopped(f"**{reason[:1].upper()}{reason[1:]}** ({what})")

    def expect(self, request: gr.Request | None = None) -> None:
        """A job was clicked: until it starts, Cancel stops it before it runs."""
        self.jobs.expect(session_key(request))

    def abandon(self, request: gr.Request | None = None) -> None:
        """The session's browser went away (tab closed or reloaded): its job stops at its next step."""
        self.jobs.cancel(session_key(request))

    def cancel(self, request: gr.Request | None = None) -> str:
        """Stop this session's running job at its next denoising step (or before it starts, when still queued)."""
        label = self.jobs.cancel(session_key(request))
        if label is None:
            return "Nothing of yours is running."
        return f"Cancelling **{label}**: it stops at its next step; the model is left unchanged."


def _reporters(progress: gr.Progress | None, what: str) -> tuple[Callable[[int, int], None], Callable[[str], None]]:
    """``on_step(done, total)`` and ``on_phase(name)`` that draw a job's progress on ``gr.Progress`` (None: none)."""
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

    return on_step, on_phase


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

    def __init__(self, backend: Backend, jobs: RunningJobs) -> None:
        self.backend = backend
        self.runner = JobRunner(backend, jobs)

    def generate(self, request: GenerationRequest, adapters: Sequence[LoRASettings], token: str | None,
                 http_request: gr.Request | None, progress: gr.Progress | None) -> GenerationOutput | Stopped:
        """Run one generation; the GenerationOutput, or Stopped when cancelled."""
        return self._learned(self.runner.run(lambda: self.backend.submit_generate(request, adapters, token or None),
                                             http_request, progress, "generation"))

    def _learned(self, output: GenerationOutput | Stopped) -> GenerationOutput | Stopped:
        """``output``, its seconds taught to the page's estimator (``estimates.py``: this server's runs)."""
        if not isinstance(output, Stopped):
            estimator_for(self.backend).learn(output.result.request, output.result.seconds,
                                              (output.settings.get("time") or {}).get("predicted_s"))
        return output

    def generate_view(self, form: JobForm, infos: Sequence[Mapping[str, Any] | None] = (),
                      request: gr.Request | None = None, progress: gr.Progress = gr.Progress()) -> GenerateView | Stopped:
        """Generate with the session's adapters (``infos``: each slot's inspect JSON, for the sglang notes)."""
        generation, adapters = self._job(form)
        output = self.generate(generation, adapters, form.token, request, progress)
        if isinstance(output, Stopped):
            return output.after(form.session, "generate")
        return self._finished(form, infos, generation, output)

    def generate_views(self, form: JobForm, infos: Sequence[Mapping[str, Any] | None], request: gr.Request | None,
                       progress: gr.Progress | None, board: PreviewBoard, previews: bool = True
                       ) -> Iterator[Progress | GenerateView | Stopped]:
        """:meth:`generate_view` with step previews on ``board``: the job's progress while it runs (each time it
        or a preview changed), then the view (or Stopped). ``previews`` False (the page's toggle off): the run
        decodes none, as through the API."""
        generation, adapters = self._job(form)
        shown = board if previews else None
        output = self._learned((yield from self.runner.stream(
            lambda: self.backend.submit_generate(generation, adapters, form.token or None, previews=shown), request,
            progress, "generation", board)))
        yield (output.after(form.session, "generate") if isinstance(output, Stopped)
               else self._finished(form, infos, generation, output))

    @staticmethod
    def _job(form: JobForm) -> tuple[GenerationRequest, list[LoRASettings]]:
        try:
            return (form.request.to_request(random.randint(0, RANDOM_SEED_TOP) if form.request.randomize else None),
                    job_adapters(form.session, form.mode))
        except H3AppError as error:
            raise user_error(error) from error

    @staticmethod
    def _finished(form: JobForm, infos: Sequence[Mapping[str, Any] | None], generation: GenerationRequest,
                  output: GenerationOutput) -> GenerateView:
        summary = output.to_json()
        settings = {**output.settings, "result": {k: v for k, v in summary.items() if k not in ("adapters", "out")},
                    "applied": applied_lines(output.settings.get("adapters") or ()),
                    "not_applied": not_applied_lines(output.settings.get("adapters") or ())}
        sglang = reproduction_views(settings, list(infos)[:len(output.settings.get("adapters") or [])])
        label = history_words.entry_label("generate", output.settings)
        session = add_history(form.session, kind="generate", label=label, video=output.video_path,
                              thumbnail=output.thumbnail_path, hash=summary["hash"], settings=output.settings)
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
    seed: int = SEED
    settings_json: dict[str, Any] = field(default_factory=dict)
    result_html: str = ""
    session: Session = field(default_factory=Session)


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


# ---------------------------------------------------------------------------------------- presets and prompts
def request_problem(form: RequestForm, limits: Limits) -> str | None:
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
        return visitor_text(str(error))
    return None


def request_note(form: RequestForm, limits: Limits, info: Mapping[str, Any] | None) -> str:
    """The line under the request's numbers: a refused value in one line (nothing is clamped; Generate,
    Equivalence and Grid refuse it the same way), else what the steps mean (:func:`steps_note`)."""
    problem = request_problem(form, limits)
    if problem is not None:
        return f"**✖ Not applied:** {problem}"
    return steps_note(form.steps, info)


def steps_note(steps: float, info: Mapping[str, Any] | None) -> str:
    """N steps → N−1 transformer evaluations, and a warning when a known distilled adapter wants another count or
    the file declares another (``adapters/recipe.py``)."""
    steps = int(steps)
    text = f"**{steps} steps → {evaluations(steps)} transformer evaluations**."
    known = (info or {}).get("known") or {}
    if known.get("steps") and int(known["steps"]) != steps:
        text += (f"  \n⚠ {known.get('title', 'this adapter')} was made for **{int(known['steps'])} steps** "
                 f"({evaluations(known['steps'])} evaluations): use *Apply preset*.")
    for note in run_notes((info or {}).get("recipe"), {"steps": steps}, "Steps is"):  # what the file declares
        text += f"  \n⚠ the adapter {note}."
    return text


def with_trigger(prompt: str | None, info: Mapping[str, Any] | None) -> str:
    """The prompt with the adapter's trigger word in front (the registry's, else the one its training metadata
    gives: ``adapters.training.trigger_word``); unchanged if it is already there or there is none."""
    trigger = trigger_word(info)
    prompt = prompt or ""
    if not trigger or trigger.lower() in prompt.lower():
        return prompt
    return f"{trigger}, {prompt}" if prompt else trigger


def sample_prompt(label: str) -> str:
    """A sample prompt button's click: its label (a prompt the held model knows, ``RequestDefaults.sample_prompts``)
    becomes the prompt."""
    return str(label)


def trigger_button(info: Mapping[str, Any] | None) -> dict[str, Any]:
    trigger = trigger_word(info)
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
    """The known adapter's recommended scale, steps, shifts and workflow, and the prompt with its trigger word (its
    own prompt in place of ``prompt`` when the registry gives one: the tiny demo's base knows one sentence pattern)."""
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
                      with_trigger(known.get("prompt") or prompt, info), override, alpha)


@dataclass(frozen=True)
class WorkflowInputs:
    """Which of the workflow's own inputs are shown: the keyframe row and the reference uploads."""

    keyframes: Any
    references: Any


def workflow_inputs(workflow: str) -> WorkflowInputs:
    """Show keyframe uploads for fl2va and reference uploads for ref2va."""
    return WorkflowInputs(gr.update(visible=workflow == FL2VA), gr.update(visible=workflow == REF2VA))
