"""Per-evaluation events of a generation: one small mechanism for whatever must happen around each transformer
evaluation of a denoising run.

diffusers' modular H3 denoise loop (``MiniMaxH3DenoiseLoopWrapper``) has no step callback, so the run is observed at
the transformer itself, with torch's public forward hooks, and the schedule is read from the pipeline's schedulers'
public ``sigmas``. Each evaluation is described by an :class:`Evaluation`: its index, the run's count, and the sigma
interval it integrates, for video and for audio (each modality has its own schedule and shift).

Listeners (:class:`EvaluationListener`) hear ``run_starting`` (before anything runs; a refusal there costs
nothing), ``before_evaluation``, ``after_evaluation`` and ``run_finished`` (always: success, failure or cancel).
They come from two places: the listeners registered by name on a transformer (:class:`StepListeners`, kept on
the transformer itself: the LoRA engine registers each adapter's strength schedule and a PDD head bank's at attach
and removes them at detach), and the ones a caller passes for one run (progress and cancel; a step preview,
``h3app.backend.preview``, which also reads the evaluation's inputs through ``evaluated``).
``h3app.backend.generation`` opens :func:`evaluation_events` around every pipeline call.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Evaluation:
    """One transformer evaluation of a run: ``index`` of ``count`` (0-based); it takes the video latents from
    ``sigma`` to ``sigma_next`` and the audio latents from ``audio_sigma`` to ``audio_sigma_next`` (σ = 1 is pure
    noise, 0 clean; H3's time is t = 1 − σ)."""

    index: int
    count: int
    sigma: float
    sigma_next: float
    audio_sigma: float
    audio_sigma_next: float


@dataclass(frozen=True)
class RunSchedule:
    """The sigma schedules of one run, terminal 0 included: ``count`` = evaluations."""

    video_sigmas: tuple[float, ...]
    audio_sigmas: tuple[float, ...]

    @property
    def count(self) -> int:
        return len(self.video_sigmas) - 1

    def evaluation(self, index: int) -> Evaluation:
        audio = min(index, len(self.audio_sigmas) - 2)  # the audio grid can collapse differently under its shift
        return Evaluation(index, self.count, self.video_sigmas[index], self.video_sigmas[index + 1],
                          self.audio_sigmas[audio], self.audio_sigmas[audio + 1])

    @classmethod
    def of(cls, steps: int, shift: float, audio_shift: float) -> RunSchedule:
        """The schedules diffusers' ``MiniMaxH3Scheduler`` builds for ``steps`` sigma points at these shifts (the
        pipeline's own schedulers run the same code)."""
        # The defining module: a type checker reads diffusers' top-level name as its torch-less dummy class.
        from diffusers.schedulers.scheduling_minimax_h3 import MiniMaxH3Scheduler

        sigmas = []
        for value in (shift, audio_shift):
            scheduler = MiniMaxH3Scheduler(shift=value)
            scheduler.set_timesteps(steps)
            sigmas.append(tuple(float(s) for s in scheduler.sigmas))
        return cls(*sigmas)


class EvaluationListener:
    """What happens around the evaluations of a run; every method is optional (does nothing here)."""

    def run_starting(self, schedule: RunSchedule) -> None:
        """Before the run: raise ``H3AppError`` to refuse it (nothing has run yet)."""

    def before_evaluation(self, evaluation: Evaluation) -> None:
        """Right before the transformer's forward of ``evaluation``."""

    def after_evaluation(self, evaluation: Evaluation, output: Any) -> None:
        """Right after it, with the transformer's output."""

    def evaluated(self, evaluation: Evaluation, inputs: Mapping[str, Any], output: Any) -> None:
        """Right after ``after_evaluation``, with the forward's keyword inputs too (the packed rows ``hidden_states``
        / ``audio_hidden_states`` at this evaluation's σ, ``timestep``, ``timestep_indices``, the layout): what a
        step preview needs to form the clean-sample estimate. Read them, never write them: the loop steps on."""

    def run_finished(self) -> None:
        """After the run, whatever its end (success, error, cancel)."""


class StepListeners:
    """The listeners registered on one transformer, by name, in the order they were added; every run of it hears
    them. Kept on the transformer it serves (as diffusers keeps a module's ``HookRegistry`` on the module), so they
    live and go with it, never in a module-wide table. A copy of the transformer starts with none (as before any
    adapter was attached)."""

    ATTRIBUTE = "h3app_step_listeners"  # the transformer's attribute that holds its registry

    def __init__(self) -> None:
        self._named: dict[str, EvaluationListener] = {}

    @classmethod
    def on(cls, transformer: torch.nn.Module) -> StepListeners:
        """``transformer``'s registry (an empty one is put on it at first use)."""
        registry = getattr(transformer, cls.ATTRIBUTE, None)
        if not isinstance(registry, StepListeners):
            registry = cls()
            setattr(transformer, cls.ATTRIBUTE, registry)
        return registry

    @classmethod
    def registered(cls, transformer: torch.nn.Module) -> tuple[EvaluationListener, ...]:
        """The listeners registered on ``transformer`` (none when it has no registry), in order."""
        registry = getattr(transformer, cls.ATTRIBUTE, None)
        return registry.listeners if isinstance(registry, StepListeners) else ()

    @property
    def listeners(self) -> tuple[EvaluationListener, ...]:
        return tuple(self._named.values())

    def add(self, name: str, listener: EvaluationListener) -> None:
        """Hear every run from now on as ``name`` (one listener per name: registering a name again replaces the
        listener it named, in its place)."""
        self._named[name] = listener

    def remove(self, name: str) -> None:
        """Stop ``name`` hearing runs (nothing when it is not registered)."""
        self._named.pop(name, None)

    def __deepcopy__(self, memo: dict[int, Any]) -> StepListeners:
        return StepListeners()  # a copied transformer has no engine: nothing of the original's adapters listens

    def __reduce__(self) -> tuple[type[StepListeners], tuple[()]]:
        return StepListeners, ()


@contextmanager
def evaluation_events(transformer: torch.nn.Module, schedule: RunSchedule,
                      extra: Sequence[EvaluationListener] = ()) -> Iterator[list[int]]:
    """Inside the block, every forward of ``transformer`` is one evaluation of ``schedule``: the registered listeners
    and ``extra`` hear it (registered ones first). Yields ``[evaluations started]``. Every listener's
    ``run_starting`` runs on entry; ``run_finished`` on exit for those that started, even on errors."""
    every = [*StepListeners.registered(transformer), *extra]
    started: list[EvaluationListener] = []
    done = [0]
    current: list[Evaluation] = []

    def before(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        evaluation = schedule.evaluation(min(done[0], schedule.count - 1))
        current[:] = [evaluation]
        done[0] += 1
        for listener in every:
            listener.before_evaluation(evaluation)

    def after(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        for listener in every:
            listener.after_evaluation(current[0], output)
        for listener in every:
            listener.evaluated(current[0], kwargs, output)

    handles: list[Any] = []

    def finish() -> BaseException | None:
        for handle in handles:
            handle.remove()
        first = None
        for listener in started:
            try:
                listener.run_finished()
            except BaseException as error:  # every listener gets to clean up; the first failure is kept
                first = first or error
        return first

    try:
        for listener in every:
            started.append(listener)
            listener.run_starting(schedule)
        handles = [transformer.register_forward_pre_hook(before, with_kwargs=True),
                   transformer.register_forward_hook(after, with_kwargs=True)]
        yield done
    except BaseException:
        finish()  # the run's own error is the one to report
        raise
    failed = finish()
    if failed is not None:
        raise failed
