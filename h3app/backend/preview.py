"""Step previews: after every transformer evaluation, the flow scheduler's clean-sample estimate, decoded cheaply.

At evaluation ``k`` the denoiser sees the packed latents ``x`` at noise level σ (1 = noise, 0 = clean; H3's time is
t = 1 − σ) and predicts a *data-ward* velocity ``v``. ``MiniMaxH3Scheduler.step`` forms the clean estimate

    x̂₀ = x + σ · v        (note the +: diffusers' other flow schedulers use x − σ · v)

then moves to ``x_next = (σ_next / σ) · x + (1 − σ_next / σ) · x̂₀``. :func:`clean_estimate` forms x̂₀ the same way,
in fp32, for the generated video and audio rows (conditioning rows dropped, rows unpacked to latents); at the last
evaluation σ_next = 0, so x̂₀ is bitwise the final latents and the last preview is the final video.

:class:`StepPreview` is a per-run :class:`~h3app.lora.evaluations.EvaluationListener`: it reads the evaluation's
inputs and output (never writes them), decodes x̂₀ with ``model.preview_decoders`` into a strip of the first, middle
and last frames (and a waveform band when the audio decode is cheap), and hands it to a :class:`PreviewBoard` —
one per request, so two visitors never see each other's previews. A preview that fails turns previews off for the
rest of the run with a note; it never fails the run.

A board with a ``budget`` (a share of the run's denoising time, the page's) thins its previews so that they cost what
they show: the first evaluation is previewed, and a later one only while the previews' seconds so far plus one more
stay within ``budget`` × the denoising seconds so far. Where a preview costs less than ``budget`` of a step (the full
model on a GPU: a few %) every step is previewed; where it costs more (the tiny model, whose VAE decode costs about
two of its steps) they come further apart. Without a budget (the CLI's ``--preview``) every step is previewed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import H3AppError
from ..lora.evaluations import Evaluation, EvaluationListener
from ..model import preview_decoders
from ..model.preview_decoders import Decoders
from ..rules import values
from .worker import POLL_SECONDS, JobHandle, Progress

AUDIO_BUDGET = 0.05  # the audio preview is kept while its decode costs at most this share of a step
AUDIO_PROBE = 16  # audio latents decoded once to measure that share
PREVIEW_HEIGHT = 128  # pixels of each frame in the strip
WAVE_HEIGHT = 40  # pixels of the waveform band (left channel above, right below)
GAP = 4
BACKGROUND, WAVE_COLOUR = (24, 24, 27), (125, 211, 252)
MAX_FRAME_ROWS = 1 << 14  # position rows read to find one latent frame's layout (a 1344 × 768 frame has 1008)


@dataclass(frozen=True)
class Layout:
    """Where the generated rows sit in one run's packed sequence, and the latent geometry they unpack to."""

    video_start: int  # sequence position of the first generated video row; generated rows run to the end
    video_rows: int
    audio_rows: int  # the trailing generated audio rows (channel-major)
    frames: int  # patch frames
    height: int  # patches
    width: int
    patch: tuple[int, int, int]
    audio_channels: int


def read_layout(inputs: Mapping[str, Any], patch: Sequence[int], audio_channels: int) -> Layout:
    """The generated rows' layout from the transformer's inputs. Every H3 layout ends ``[target audio | target
    video]``: the target video starts right after the last audio row and shares its rotary origin with the target
    audio, whose rows are ``audio_channels`` blocks of one row per audio latent."""
    pt, ph, pw = (int(p) for p in patch)  # a video patch is (frames, height, width)
    positions = inputs["position_ids"]
    audio_indices = inputs["audio_indices"]
    video_start = int(audio_indices[-1]) + 1
    video_rows = positions.shape[0] - video_start
    head = positions[video_start:video_start + min(video_rows, MAX_FRAME_ROWS)].detach().cpu().numpy()
    frame_rows = _run_length(head[:, 0])
    width = _run_length(head[:frame_rows, 1])
    origin = float(head[0, 0])
    last_audio = float(positions[int(audio_indices[-1]), 0])
    audio_rows = audio_channels * int(round(last_audio - origin + 1))
    if video_rows % frame_rows or frame_rows % width or audio_rows <= 0:
        raise ValueError(f"unexpected packed layout ({video_rows} video rows, {frame_rows} per frame)")
    return Layout(video_start, video_rows, audio_rows, video_rows // frame_rows, frame_rows // width, width,
                  (pt, ph, pw), audio_channels)


def _run_length(values: np.ndarray) -> int:
    """How many leading entries equal the first."""
    changed = np.flatnonzero(values != values[0])
    return int(changed[0]) if changed.size else int(values.shape[0])


def velocities(output: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The transformer output's (video, audio) velocities: a tuple or an output with ``sample`` / ``audio_sample``."""
    return (output.sample, output.audio_sample) if hasattr(output, "sample") else (output[0], output[1])


def clean_estimate(inputs: Mapping[str, Any], output: Any, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """x̂₀ = x + σ · v of the generated rows, fp32, as ``(1, C, L, h, w)`` video and ``(channels, C_a, L_a)`` audio
    latents (normalised, on the transformer's device). σ = 1 − t of each row's own timestep, as the scheduler."""
    video_v, audio_v = velocities(output)
    timestep, row_timestep = inputs["timestep"], inputs["timestep_indices"]
    x = inputs["hidden_states"][0, -layout.video_rows:]
    sigma = 1 - timestep[row_timestep[layout.video_start]].float()
    video = x.float() + sigma * video_v[0, -layout.video_rows:].float()
    pt, ph, pw = layout.patch
    channels = video.shape[-1] // (pt * ph * pw)
    video = video.reshape(1, layout.frames, layout.height, layout.width, channels, pt, ph, pw)
    video = video.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(
        1, channels, layout.frames * pt, layout.height * ph, layout.width * pw)
    audio_x = inputs["audio_hidden_states"][0, -layout.audio_rows:]
    audio_sigma = 1 - timestep[row_timestep[inputs["audio_indices"][-1]]].float()
    audio = audio_x.float() + audio_sigma * audio_v[0, -layout.audio_rows:].float()
    audio = audio.reshape(layout.audio_channels, layout.audio_rows // layout.audio_channels, -1).permute(0, 2, 1)
    return video, audio


@dataclass(frozen=True)
class Preview:
    """One step's preview of one column: ``image`` ``[H, W, 3]`` uint8 (frames strip, waveform band below when
    ``audio``), after evaluation ``step`` (1-based) of ``count``; ``seconds`` it took beside the ``step_seconds``
    of the evaluation it follows; ``path``: its PNG when the board writes files."""

    column: str
    step: int
    count: int
    image: np.ndarray
    decoder: str
    audio: bool
    seconds: float
    step_seconds: float
    path: str | None = None
    read_bytes: int = 0  # device bytes it read: the packed rows and velocities, the weights of what decoded them


def _resized(frame: np.ndarray, height: int) -> np.ndarray:
    from PIL import Image

    picture = Image.fromarray(np.clip(np.rint(frame * 255), 0, 255).astype(np.uint8))
    width = max(1, round(picture.width * height / picture.height))
    return np.asarray(picture.resize((width, height), Image.Resampling.BILINEAR))


def waveform_band(audio: np.ndarray, width: int, height: int = WAVE_HEIGHT) -> np.ndarray:
    """``audio`` ``[channels, samples]`` in [-1, 1] drawn as min/max columns, one band per channel, ``[height,
    width, 3]`` uint8."""
    band = np.empty((height, width, 3), np.uint8)
    band[:] = BACKGROUND
    lane = height // audio.shape[0]
    starts = np.linspace(0, audio.shape[1], width, endpoint=False).astype(int)
    for channel, samples in enumerate(audio):
        low, high = np.minimum.reduceat(samples, starts), np.maximum.reduceat(samples, starts)
        middle, half = channel * lane + lane / 2, (lane - 2) / 2
        rows = np.arange(channel * lane, (channel + 1) * lane)[:, None]
        mask = (rows >= np.floor(middle - high * half)) & (rows <= np.ceil(middle - low * half))
        band[channel * lane:(channel + 1) * lane][mask] = WAVE_COLOUR
    return band


def strip(frames: np.ndarray, audio: np.ndarray | None, height: int = PREVIEW_HEIGHT) -> np.ndarray:
    """Frames ``[n, H, W, 3]`` in [0, 1] side by side at ``height`` pixels (``GAP`` between), with ``audio``'s
    waveform band below; ``[H', W', 3]`` uint8."""
    pictures = [_resized(frame, height) for frame in frames]
    width = sum(p.shape[1] for p in pictures) + GAP * (len(pictures) - 1)
    image = np.empty((height, width, 3), np.uint8)
    image[:] = BACKGROUND
    x = 0
    for picture in pictures:
        image[:, x:x + picture.shape[1]] = picture
        x += picture.shape[1] + GAP
    if audio is None:
        return image
    gap = np.empty((GAP, width, 3), np.uint8)
    gap[:] = BACKGROUND
    return np.concatenate([image, gap, waveform_band(audio, width)])


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _synchronised(device: torch.device) -> None:
    """Wait for the GPU's queued work, so that seconds measured are work done (a preview copies to the host and
    would wait anyway); nothing to wait for elsewhere."""
    if device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(device)


class StepPreview(EvaluationListener):
    """The per-run listener: one :class:`Preview` of ``column`` on ``board`` after every evaluation."""

    def __init__(self, board: PreviewBoard, column: str, decoders: Decoders, patch: Sequence[int],
                 audio_channels: int) -> None:
        self.board, self.column, self.decoders = board, column, decoders
        self.patch, self.audio_channels = tuple(patch), audio_channels
        self.layout: Layout | None = None
        self.started = 0.0
        self.stopped = False
        self.denoised = 0.0  # seconds of evaluations so far (previews not counted)
        self.spent = 0.0  # seconds of previews so far
        self.cost = 0.0  # the last preview's seconds

    def before_evaluation(self, evaluation: Evaluation) -> None:
        self.started = time.perf_counter()

    def evaluated(self, evaluation: Evaluation, inputs: Mapping[str, Any], output: Any) -> None:
        if self.stopped:
            return
        try:
            _synchronised(inputs["hidden_states"].device)
            begun = time.perf_counter()
            self.denoised += begun - self.started
            if not self.board.wants(self.spent, self.cost, self.denoised):
                self.board.skipped()
                return
            with torch.inference_mode():
                image, audio, read = self._picture(inputs, output, begun - self.started)
        except Exception as error:  # a preview must never fail the run: previews stop, the run goes on
            self.stopped = True
            self.board.note(f"previews stopped at step {evaluation.index + 1}: {type(error).__name__}: {error}")
            return
        self.cost = time.perf_counter() - begun
        self.spent += self.cost
        self.board.put(Preview(self.column, evaluation.index + 1, evaluation.count, image, self.decoders.video.name,
                               audio, self.cost, begun - self.started, read_bytes=read))

    def _picture(self, inputs: Mapping[str, Any], output: Any,
                 step_seconds: float) -> tuple[np.ndarray, bool, int]:
        """The strip, whether it has the waveform band, and the device bytes the preview read."""
        if self.layout is None:
            self.layout = read_layout(inputs, self.patch, self.audio_channels)
        video, audio = clean_estimate(inputs, output, self.layout)
        frames = self.decoders.video.frames(video)
        wave = self._waveform(audio, step_seconds)
        read = sum(_nbytes(t) for t in (inputs["hidden_states"], inputs["audio_hidden_states"], *velocities(output)))
        read += _nbytes(*getattr(self.decoders.video, "vae", torch.nn.Module()).parameters())
        if wave is not None and self.decoders.audio is not None:  # a waveform comes from the audio decoder only
            read += _nbytes(*self.decoders.audio.vae.parameters())
        return strip(frames, wave), wave is not None, read

    def _waveform(self, audio: torch.Tensor, step_seconds: float) -> np.ndarray | None:
        """The audio estimate's waveform when wanted (``board.audio``; None: while within :data:`AUDIO_BUDGET`
        of a step), else None. The budget is measured once per loaded model, at its first previewed step, on a
        slice of :data:`AUDIO_PROBE` latents scaled to the whole (the decoder is convolutional: cost ∝ length)."""
        wanted, decoder = self.board.audio, self.decoders.audio
        if decoder is None or wanted is False:
            return None
        if decoder.share is None:
            probe = audio[..., :AUDIO_PROBE]
            begun = time.perf_counter()
            decoder.waveform(probe)
            decoder.share = (time.perf_counter() - begun) * audio.shape[-1] / probe.shape[-1] / max(step_seconds, 1e-9)
            if decoder.share > AUDIO_BUDGET:
                decoder.note = (f"audio preview off: decoding the audio estimate would cost {decoder.share:.0%} of a "
                                f"step on this model (budget {AUDIO_BUDGET:.0%}); the strip shows the video only")
        if wanted is None and decoder.share > AUDIO_BUDGET:
            return None
        return decoder.waveform(audio)


class PreviewBoard:
    """The previews of one request (one job: a generation, a check's columns, a grid's cells), for the one person
    who asked. Thread-safe: the worker puts, the caller's thread reads or waits. With ``folder`` every preview is
    also written as ``folder/step-K.png`` (column ``""``) or ``folder/<column>/step-K.png``.

    ``decoder``: one of ``model.preview_decoders.DECODERS``; ``audio``: None = the waveform band while within
    :data:`AUDIO_BUDGET`, True = always, False = never; ``budget``: the share of the denoising time previews may
    take (None: a preview after every evaluation; see the module docstring)."""

    def __init__(self, folder: str | Path | None = None, decoder: str = "auto", audio: bool | None = None,
                 budget: float | None = None) -> None:
        if decoder not in preview_decoders.DECODERS:
            raise H3AppError(f"the preview decoder must be one of {', '.join(preview_decoders.DECODERS)}, "
                             f"got {values.short(decoder)}.")
        self.folder = Path(folder) if folder is not None else None
        if self.folder is not None and self.folder.exists() and not self.folder.is_dir():
            raise H3AppError(f"the preview folder {str(self.folder)!r} is a file: give a folder (it is created).")
        self.decoder, self.audio, self.budget = decoder, audio, budget
        self.thinned = 0  # evaluations left without a preview to stay within the budget
        self._history: dict[str, list[Preview]] = {}
        self._started: dict[str, int] = {}  # column → the board version its first preview came at
        self._notes: list[str] = []
        self._decoders: Decoders | None = None
        self._version = 0
        self._changed = threading.Condition()

    def listener(self, pipe: Any, column: str = "") -> StepPreview:
        """A listener for one run of ``pipe`` whose previews go to ``column``."""
        self._decoders = preview_decoders.for_pipeline(pipe, self.decoder)
        return StepPreview(self, column, self._decoders, pipe.patch_size, int(pipe.audio_channels))

    def put(self, preview: Preview) -> None:
        if self.folder is not None:
            from PIL import Image

            folder = self.folder / preview.column if preview.column else self.folder
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"step-{preview.step}.png"
            Image.fromarray(preview.image).save(path)
            preview = Preview(**{**vars(preview), "path": str(path)})
        with self._changed:
            self._history.setdefault(preview.column, []).append(preview)
            self._started.setdefault(preview.column, self._version)
            self._version += 1
            self._changed.notify_all()

    def wants(self, spent: float, cost: float, denoised: float) -> bool:
        """Whether a run's listener previews this evaluation: always without a budget and for its first preview
        (``cost`` 0: not measured yet), else while ``spent`` + ``cost`` (seconds) stays within ``budget`` ×
        ``denoised``."""
        return self.budget is None or cost == 0.0 or spent + cost <= self.budget * denoised

    def skipped(self) -> None:
        with self._changed:
            self.thinned += 1

    def note(self, text: str) -> None:
        with self._changed:
            self._notes.append(text)
            self._version += 1
            self._changed.notify_all()

    @property
    def version(self) -> int:
        """Changes so far (each preview or note adds one)."""
        return self._version

    def wait(self, version: int, timeout: float) -> int:
        """Block until the board changes after ``version`` (or ``timeout`` seconds pass); the version now."""
        with self._changed:
            self._changed.wait_for(lambda: self._version != version, timeout)
            return self._version

    def latest(self, column: str = "") -> Preview | None:
        with self._changed:
            found = self._history.get(column)
            return found[-1] if found else None

    def history(self, column: str = "") -> list[Preview]:
        with self._changed:
            return list(self._history.get(column, ()))

    def aligned(self, columns: Sequence[str]) -> dict[str, Preview]:
        """Each started column of ``columns`` at one step: the step of the column that started last (the one
        denoising now); a column without that step shows its last (so the fallback, run first, is shown at A's
        step while A denoises, and A at B's while B does)."""
        with self._changed:
            started = [c for c in columns if self._history.get(c)]
            if not started:
                return {}
            running = max(started, key=lambda c: self._started[c])
            step = self._history[running][-1].step
            out = {}
            for column in started:
                at = [p for p in self._history[column] if p.step == step]
                out[column] = at[-1] if at else self._history[column][-1]
            return out

    def notes(self) -> list[str]:
        with self._changed:
            audio = self._decoders.audio if self._decoders is not None and self.audio is None else None
            return [*self._notes, *([audio.note] if audio is not None and audio.note else [])]

    def summary(self) -> dict[str, Any]:
        """For ``--json``: the folder, the files written, previews per column, the decoder, the audio band, the
        mean preview cost (seconds) and its share of the step it followed, and notes."""
        with self._changed:
            every = [p for previews in self._history.values() for p in previews]
        seconds = sum(p.seconds for p in every) / len(every) if every else None
        steps = sum(p.step_seconds for p in every) / len(every) if every else None
        with self._changed:
            columns = {column or "generation": len(previews) for column, previews in self._history.items()}
        return {"dir": str(self.folder) if self.folder is not None else None, "files": sum(bool(p.path) for p in every),
                "columns": columns,
                "decoder": every[-1].decoder if every else None, "audio": bool(every and every[-1].audio),
                "seconds_per_preview": round(seconds, 4) if seconds is not None else None,
                "share_of_step": round(seconds / steps, 4) if seconds is not None and steps else None,
                "notes": self.notes()}


def watch(handle: JobHandle, board: PreviewBoard, abandoned: Callable[[], bool] | None = None,
          poll: float = POLL_SECONDS) -> Iterator[Progress]:
    """Follow a job whose previews go to ``board``: yield its progress each time the progress or the board changed,
    until the job ends (then ``handle.result()`` gives its result or raises its error, a cancel included).
    ``abandoned()`` is polled as in :func:`~h3app.backend.worker.wait`: the job is cancelled when nobody waits."""
    seen = None
    while True:
        done = handle.done
        progress = handle.progress
        now = (progress.phase, progress.position, progress.done, progress.total, board.version)
        if now != seen:
            seen = now
            yield progress
        if done:
            return
        handle.wait_for_change(poll)
        handle.cancel_if(abandoned)
