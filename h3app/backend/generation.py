"""One generation: a frozen request → decoded video + stereo audio (+ mp4), seeded and deterministic.

``num_inference_steps`` counts sigma points *including* the terminal one, so N steps run N−1 transformer
evaluations (fewer if the shift collapses duplicate sigmas). Every pipeline call runs inside
``h3app.lora.evaluations.evaluation_events`` (diffusers' H3 denoise loop has no step callback): progress and cancel,
and whatever the transformer's registered listeners do at each evaluation (a PDD head bank), hear each evaluation
with its index, count and sigma interval.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import H3AppError
from ..lora.evaluations import Evaluation, EvaluationListener, RunSchedule, StepListeners, evaluation_events
from ..lora.head_bank import BankListener
from ..model.compiled import compiled_runs
from ..model.denoise_cache import CacheCount, step_cache
from ..request import GenerationRequest, reference_kind
from ..rules import values
from ..rules.choices import NO_CACHE, REF2VA
from ..rules.frames import FPS
from . import media
from .limits import model_limits
from .worker import Cancelled  # noqa: F401  (raised here; callers import it from this module)


def _at_rate(reference: Any, sample_rate: int) -> Any:
    """A reference whose soundtrack is resampled to the audio VAE's rate (diffusers would need torchaudio)."""
    import dataclasses

    audio = getattr(reference, "audio", None)
    rate = getattr(reference, "sample_rate", None)
    if audio is None or rate is None or int(rate) == sample_rate:
        return reference
    resampled = media.resample_audio(audio.detach().float().cpu().numpy(), int(rate), sample_rate)
    return dataclasses.replace(reference, audio=torch.from_numpy(resampled), sample_rate=sample_rate)


def workflow_inputs(request: GenerationRequest, sample_rate: int = 32000) -> dict[str, Any]:
    """The pipeline inputs for keyframes (fl2va) and references (ref2va), decoded from their files; reference
    soundtracks at ``sample_rate`` (Hz)."""
    from PIL import Image

    inputs: dict[str, Any] = {}
    try:
        if request.first_frame:
            inputs["image"] = Image.open(request.first_frame).convert("RGB")
        if request.last_frame:
            inputs["last_image"] = Image.open(request.last_frame).convert("RGB")
        if request.references:
            from diffusers.modular_pipelines.minimax_h3 import (
                MiniMaxH3AudioReference,
                MiniMaxH3ImageReference,
                MiniMaxH3VideoReference,
            )

            readers: dict[str, Callable[[str], Any]] = {
                "image": MiniMaxH3ImageReference.from_file, "video": MiniMaxH3VideoReference.from_file,
                "audio": MiniMaxH3AudioReference.from_file}
            inputs["references"] = [_at_rate(readers[reference_kind(p)](p), sample_rate) for p in request.references]
    except H3AppError:
        raise
    except Exception as error:  # PIL/PyAV decoding errors come in many types; name the problem for the user
        raise H3AppError(f"could not read an input file ({type(error).__name__}: {error}); use a PNG/JPEG "
                         f"image, an mp4 video or a WAV audio file.") from error
    return inputs


@dataclass(frozen=True)
class GenerationResult:
    """Decoded output: ``video`` ``[F, H, W, 3]`` float32 in [0, 1]; ``audio`` ``[2, S]`` float32 in [-1, 1]."""

    video: np.ndarray
    audio: np.ndarray
    sample_rate: int
    evaluations: int
    seconds: float
    hash: str
    request: GenerationRequest
    fps: int = FPS  # the pipeline's frame rate
    cache: dict[str, Any] | None = None  # the step cache's count: ``{kind, threshold, evaluations, skipped}``

    @property
    def frames(self) -> int:
        return int(self.video.shape[0])

    @property
    def height(self) -> int:
        return int(self.video.shape[1])

    @property
    def width(self) -> int:
        return int(self.video.shape[2])


def request_shift(pipe: Any, request: GenerationRequest) -> float:
    """The video shift ``request`` runs at: its own, or the pipeline scheduler's default."""
    return request.shift if request.shift is not None else float(pipe.scheduler.config.shift)


def request_evaluations(pipe: Any, request: GenerationRequest) -> int:
    """Transformer evaluations of one generation of ``request`` on ``pipe``."""
    return count_evaluations(request.steps, request_shift(pipe, request))


def count_evaluations(steps: int, shift: float) -> int:
    """Transformer evaluations for ``steps`` sigma points at ``shift`` (N−1 unless the shift collapses sigmas)."""
    # The defining module: a type checker reads diffusers' top-level name as its torch-less dummy class.
    from diffusers.schedulers.scheduling_minimax_h3 import MiniMaxH3Scheduler

    scheduler = MiniMaxH3Scheduler(shift=shift)
    scheduler.set_timesteps(steps)
    return len(scheduler.timesteps)


@contextmanager
def _prepared(pipe: Any, request: GenerationRequest) -> Iterator[tuple[dict[str, Any], torch.nn.Module, RunSchedule]]:
    """The pipeline inputs of ``request``, the transformer it runs and its schedule (``count`` evaluations), with
    the request's shifts set on the schedulers for the duration (restored afterwards, also on errors)."""
    model_limits(pipe).check_request(request, getattr(pipe, "tokenizer", None))
    video_shift = request_shift(pipe, request)
    audio_shift = request.audio_shift if request.audio_shift is not None else float(pipe.audio_scheduler.config.shift)
    inputs: dict[str, Any] = {
        "num_inference_steps": int(request.steps),
        "num_frames": request.num_frames,
        "generator": torch.Generator("cpu").manual_seed(int(request.seed)),
        "output_type": "np",
        "prompt": request.prompt,
    }
    if request.height is not None and request.width is not None:  # both or neither (GenerationRequest's check)
        inputs["height"], inputs["width"] = int(request.height), int(request.width)
    inputs.update(workflow_inputs(request, int(pipe.audio_vae.config.sampling_rate)))
    transformer = pipe.transformer_ref if request.workflow == REF2VA else pipe.transformer
    pipe.scheduler.set_shift(video_shift)
    pipe.audio_scheduler.set_shift(audio_shift)
    try:
        with compiled_runs(transformer):  # --compile: the switches the graphs were built under (model/compiled.py)
            yield inputs, transformer, RunSchedule.of(int(request.steps), video_shift, audio_shift)
    finally:
        pipe.scheduler.set_shift(float(pipe.scheduler.config.shift))
        pipe.audio_scheduler.set_shift(float(pipe.audio_scheduler.config.shift))


class _QuietControlFlow(logging.Filter):
    """Drops diffusers' "Error in block … Traceback" records while the exception passing through the pipeline is one
    of ours that ends a run on purpose (a cancel, the control step's early stop): they are not errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not isinstance(sys.exc_info()[1], (Cancelled, _FirstStepDone))


# diffusers' block runner logs every exception leaving a block; installed once (a filter per call would be removed
# by one thread while another still runs a pipeline).
logging.getLogger("diffusers.modular_pipelines.modular_pipeline").addFilter(_QuietControlFlow())


def _call(pipe: Any, inputs: dict[str, Any]) -> Any:
    """``pipe(**inputs)`` with the errors a user can act on as one line."""
    try:
        with torch.inference_mode():
            return pipe(**inputs)
    except torch.OutOfMemoryError as error:
        raise H3AppError(
            "out of GPU memory: use a smaller canvas or duration, --offload auto, or bf16; the model is unchanged."
        ) from error
    except ValueError as error:
        raise H3AppError(f"the pipeline refused the request: {values.short(str(error), 300)}") from error


class _Progress(EvaluationListener):
    """Progress and cancel: ``on_step(done, total)`` before every evaluation; a cancel asked for raises
    :class:`Cancelled` there (``done`` evaluations run)."""

    def __init__(self, on_step: Callable[[int, int], None] | None, should_cancel: Callable[[], bool] | None,
                 total: int) -> None:
        self.on_step, self.should_cancel, self.total = on_step, should_cancel, total

    def before_evaluation(self, evaluation: Evaluation) -> None:
        if self.should_cancel is not None and self.should_cancel():
            raise Cancelled(evaluation.index, self.total)
        if self.on_step is not None:
            self.on_step(evaluation.index, self.total)


def run_generation(pipe: Any, request: GenerationRequest, *, on_step: Callable[[int, int], None] | None = None,
                   should_cancel: Callable[[], bool] | None = None,
                   listeners: tuple[EvaluationListener, ...] = ()) -> GenerationResult:
    """Run ``pipe`` (a workflow pipeline from :class:`h3app.model.loader.LoadedModel`) on ``request``.

    ``on_step(done, total)`` is called before every transformer evaluation and once at the end;
    ``should_cancel()`` is polled at the same points and raises :class:`Cancelled` (``done`` of ``total`` steps
    run). The transformer is untouched by a cancel (hooks are removed in all cases). ``listeners`` hear every
    evaluation of this run besides the transformer's registered ones (``h3app.lora.evaluations``).
    """
    with _prepared(pipe, request) as (inputs, transformer, schedule):
        _refuse_cache_with_banks(transformer, request.cache)
        progress = _Progress(on_step, should_cancel, schedule.count)
        start = time.perf_counter()
        with step_cache(transformer, request.cache) as count, \
                evaluation_events(transformer, schedule, (progress, *listeners)) as started:
            state = _call(pipe, inputs)
        seconds = time.perf_counter() - start
    done = [started[0]]
    if on_step is not None:
        on_step(done[0], schedule.count)
    video = np.asarray(state.get("videos")[0], dtype=np.float32)
    audio = state.get("audio")[0].detach().float().cpu().numpy()
    if not (np.isfinite(video).all() and np.isfinite(audio).all()):
        raise H3AppError("the output is NaN/Inf: a LoRA scale (alpha × scale / rank) is far too large for this "
                         "model; lower alpha or scale.")
    return GenerationResult(
        video=video,
        audio=audio,
        sample_rate=int(state.get("sampling_rate")),
        evaluations=done[0],
        seconds=seconds,
        hash=media.content_hash(video, audio),
        request=request,
        fps=int(getattr(pipe, "fps", FPS)),
        cache=cache_json(count, done[0]),
    )


def cache_json(count: CacheCount, evaluations: int) -> dict[str, Any]:
    """The step cache's record of a run of ``evaluations`` (none: every evaluation ran all blocks)."""
    return {**count.to_json(), "evaluations": evaluations, "skipped": count.skipped}


def _refuse_cache_with_banks(transformer: torch.nn.Module, cache: str) -> None:
    """A PDD head bank (``lora.head_bank``) swaps heads at every evaluation; a skipped evaluation would reuse the
    residual of the last one's heads. Its recipe says not to stack it with a step cache: refused before anything runs."""
    banks = [listener for listener in StepListeners.registered(transformer) if isinstance(listener, BankListener)]
    if cache != NO_CACHE and banks:
        raise H3AppError(f"--cache {cache} cannot run with a PDD head-bank adapter (its heads change at every "
                         f"evaluation; a skipped evaluation would reuse the last one's): run without --cache.")


class _FirstStepDone(Exception):
    """Raised from a forward hook to end a pipeline run after its first denoising step."""


def first_step_digest(pipe: Any, request: GenerationRequest) -> str:
    """sha256 of the transformer's output at ``request``'s first denoising step (fp32 video velocity, then audio
    velocity: what moves the latents); the run stops right after that step. Two equal digests at one setting show
    the device computes a denoising step deterministically, at 1/N of a full run's cost."""
    digests: list[str] = []

    class FirstOutput(EvaluationListener):
        def after_evaluation(self, evaluation: Evaluation, output: Any) -> None:
            digests.append(output_digest(output))
            raise _FirstStepDone

    with _prepared(pipe, request) as (inputs, transformer, schedule):
        try:
            with evaluation_events(transformer, schedule, (FirstOutput(),)):
                _call(pipe, inputs)
        except _FirstStepDone:
            pass
    if not digests:
        raise H3AppError("the pipeline finished without a denoising step: use at least 2 steps.")
    return digests[0]


def output_digest(output: Any) -> str:
    """sha256 over a transformer output's fp32 video velocity then audio velocity (``(video, audio)`` or an output
    object with ``sample`` / ``audio_sample``)."""
    import hashlib

    video, audio = (output.sample, output.audio_sample) if hasattr(output, "sample") else output[:2]
    digest = hashlib.sha256()
    for tensor in (video, audio):
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def save_result(result: GenerationResult, out: str | Path, settings: dict[str, Any], *,
                audio_thread: bool = True) -> Path:
    """Mux ``result`` to ``out`` (mp4) with ``settings`` embedded (``audio_thread`` as :func:`media.write_mp4`)."""
    return media.write_mp4(out, result.video, result.audio, result.sample_rate, fps=result.fps, settings=settings,
                           audio_thread=audio_thread)
