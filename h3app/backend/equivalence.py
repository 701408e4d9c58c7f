"""The equivalence check, full mode: the whole pipeline under settings A, B, the old fallback and an A-vs-A control.

Same seed, same prompt embedding (encoded once through the prompt cache), unmerged, deterministic algorithms on and
diffusers' ``native`` attention backend (for what set none: a transformer keeps the backend it was loaded with, the
one every run of the check then uses; an approximate one is refused, ``rules.attention``). The decode cache is on
for the check: a column whose latents are bitwise
equal to an earlier column's reuses its decoded output (B's decode is skipped when it matches A), and B's mp4 is
remuxed from A's. The determinism control is one denoising step at A's settings, compared with A's first step at
the transformer output that moves the latents (as ``check --mode transformer`` does with one forward): a whole
second run would cost a quarter of the check to learn the same. Hashes are sha256 over the decoded fp32 video then
audio (docs/architecture.md, decision 10). A (by default the alpha in use × strength 1) and B (alpha = rank ×
strength alpha / rank, ``rules.check_pair.default_pair``) have the same alpha × strength, so they must be
bit-identical; the fallback column is the same adapter at alpha = rank, strength 1 — what the old loaders did — which is 16× stronger
for LightX2V's rank-128 Turbo.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..adapters.parts import check_note
from ..adapters.summary import not_applied_lines
from ..errors import H3AppError
from ..model.loader import LoadOptions
from ..rules.attention import check_refusal
from ..rules.check_pair import DEFAULT_A, DEFAULT_B, CheckSetting
from ..rules.choices import FULL_CHECK, REF2VA, UNMERGED
from ..settings import LoRASettings
from . import metrics
from .generation import (
    GenerationRequest,
    GenerationResult,
    first_step_digest,
    output_digest,
    request_evaluations,
    run_generation,
    save_result,
)
from .media import remux_with_settings, write_thumbnail
from .outputs import Outputs
from .preview import PreviewBoard
from .transformer_check import summarise_scales, with_rank_alpha
from .worker import Cancelled

if TYPE_CHECKING:
    from .adapter_binding import AdapterBinder

CHECK_NAME = "equivalence-check"
FULL_RUNS = ("A", "B", "fallback")  # whole pipeline runs; the control is one denoising step
CONTROL_STEPS = 1
PHASES = ("fallback", "A", "control", "B")
DEFAULT_PROMPT = "a paper boat drifting down a rain-filled street gutter, rain and distant thunder"


@dataclass(frozen=True)
class Column:
    """One generated column: its label, settings, output file and hash."""

    label: str
    alpha: float | None
    strength: float
    video_path: str
    thumbnail_path: str
    hash: str
    effective_scale: float | dict[str, float]
    cache: dict[str, Any] | None = None  # the step cache's record of this column's run


@dataclass(frozen=True)
class EquivalenceResult:
    """Everything the equivalence tab and ``check --mode full --json`` show."""

    identical: bool
    control_identical: bool
    a: Column
    b: Column
    fallback: Column
    a_vs_b: metrics.Difference
    a_vs_fallback: metrics.Difference
    heatmap_path: str
    fallback_heatmap_path: str
    spectrogram_diff_path: str
    fallback_spectrogram_diff_path: str
    seconds: float
    settings: dict[str, Any]
    seconds_per_run: float | None = None  # A's pipeline run: what the next check's estimate is based on
    parts_note: str | None = None  # why A and B differ for an adapter with exact deltas (adapters.parts.check_note)
    low_rank_only: bool = False  # B rescaled only the low-rank parts (its deltas at A's strength)
    parts: dict[str, int] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "identical": self.identical,
            "hash_a": self.a.hash,
            "hash_b": self.b.hash,
            "hash_fallback": self.fallback.hash,
            "max_abs_diff": max(self.a_vs_b.video_max_abs_diff, self.a_vs_b.audio_max_abs_diff),
            "fallback_max_abs_diff": max(self.a_vs_fallback.video_max_abs_diff,
                                         self.a_vs_fallback.audio_max_abs_diff),
            "control_identical": self.control_identical,
            "effective_scale_a": self.a.effective_scale,
            "effective_scale_b": self.b.effective_scale,
            "effective_scale_fallback": self.fallback.effective_scale,
            "mode": FULL_CHECK,
            "seconds": round(self.seconds, 3),
            "a": dataclasses.asdict(self.a),
            "b": dataclasses.asdict(self.b),
            "fallback": dataclasses.asdict(self.fallback),
            "a_vs_b": self.a_vs_b.to_json(),
            "a_vs_fallback": self.a_vs_fallback.to_json(),
            "heatmap": self.heatmap_path,
            "fallback_heatmap": self.fallback_heatmap_path,
            "spectrogram_diff": self.spectrogram_diff_path,
            "fallback_spectrogram_diff": self.fallback_spectrogram_diff_path,
            "settings": self.settings,
            "parts": dict(self.parts),
            "low_rank_only": self.low_rank_only,
            "parts_note": self.parts_note,
            "not_applied": not_applied_lines([self.settings.get("adapter") or {}]),
            "cache": {**(self.a.cache or {}), "same_decisions": (self.a.cache or {}).get("skipped_at")
                      == (self.b.cache or {}).get("skipped_at")},
            **({"zerogpu": self.settings["zerogpu"]} if "zerogpu" in self.settings else {}),  # the calls asked for
        }


@contextmanager
def deterministic() -> Iterator[None]:
    """Deterministic algorithms and a fixed attention backend for the duration of a check."""
    from diffusers.models.attention_dispatch import attention_backend

    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with attention_backend("native"):
            yield
    finally:
        torch.use_deterministic_algorithms(was)


class _CheckRuns:
    """The check's denoising runs, in order, on one pipeline: progress counted over the whole check, and each
    column's mp4 encoded on a second thread while the next run denoises."""

    def __init__(self, pipe: Any, request: GenerationRequest, engine: Any, ranks: dict[str, int], *, total: int,
                 settings: dict[str, Any], output_dir: Path, stem: str,
                 on_step: Callable[[int, int], None] | None, should_cancel: Callable[[], bool] | None,
                 on_phase: Callable[[str], None] | None, previews: PreviewBoard | None = None) -> None:
        self.pipe, self.request, self.engine, self.ranks, self.total = pipe, request, engine, ranks, total
        self.previews = previews  # one column per run, named by its label
        self.settings, self.output_dir, self.stem = settings, output_dir, stem
        self.on_step, self.should_cancel, self.on_phase = on_step, should_cancel, on_phase
        self.results: dict[str, GenerationResult] = {}
        self.scales: dict[str, Any] = {}
        self.columns: dict[str, Future] = {}
        self.offset = 0  # denoising steps of the check done before the current run
        self.encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="h3app-encode")

    def phase(self, label: str) -> None:
        if self.on_phase is not None:
            self.on_phase(f"{label} ({PHASES.index(label) + 1}/{len(PHASES)})")

    def _steps(self, done: int, _: int) -> None:
        if self.on_step is not None:
            self.on_step(self.offset + done, self.total)

    def run(self, label: str) -> GenerationResult:
        """Denoise one full run with the adapter as now attached; its scales are summarised first."""
        self.phase(label)
        self.scales[label] = summarise_scales(self.engine.effective_scales(CHECK_NAME), self.ranks)
        try:
            listeners = (self.previews.listener(self.pipe, label),) if self.previews is not None else ()
            result = run_generation(self.pipe, self.request, on_step=self._steps, should_cancel=self.should_cancel,
                                    listeners=listeners)
        except Cancelled as stop:
            raise Cancelled(self.offset + (stop.done or 0), self.total) from None
        self.results[label] = result
        self.offset += result.evaluations
        return result

    def control(self, reference: str) -> bool:
        """The control: A's first denoising step again; True when its digest equals ``reference``."""
        self.phase("control")
        if self.should_cancel is not None and self.should_cancel():
            raise Cancelled(self.offset, self.total)
        identical = first_step_digest(self.pipe, self.request) == reference
        self.offset += CONTROL_STEPS
        return identical

    def encode(self, label: str, alpha: float | None, strength: float, same_as: str | None = None,
               last: bool = False) -> None:
        """Start writing ``label``'s mp4 and thumbnail on the encoder thread."""
        self.columns[label] = self.encoder.submit(self._column, label, alpha, strength, same_as, last)

    def _column(self, label: str, alpha: float | None, strength: float, same_as: str | None,
                last: bool) -> Column:
        result = self.results[label]
        metadata = {**self.settings, "column": label, "alpha": alpha, "strength": strength, "hash": result.hash}
        path = self.output_dir / f"{self.stem}-{label}.mp4"
        earlier = self.columns[same_as].result() if same_as is not None else None
        if earlier is not None and earlier.hash == result.hash:  # bit-identical: copy the streams, no re-encode
            video = remux_with_settings(earlier.video_path, path, metadata)
            thumb = Path(earlier.thumbnail_path)
        else:
            # Beside the next run the encode keeps to one core; the last column has no run beside it.
            video = save_result(result, path, metadata, audio_thread=last)
            thumb = write_thumbnail(self.output_dir / f"{self.stem}-{label}.png", result.video)
        return Column(label, alpha, strength, str(video), str(thumb), result.hash, self.scales[label], result.cache)

    def finished(self) -> dict[str, Column]:
        """Wait for every column's media."""
        return {label: future.result() for label, future in self.columns.items()}

    def close(self) -> None:
        self.encoder.shutdown(wait=True, cancel_futures=True)


def _difference_images(ra: GenerationResult, rb: GenerationResult, rf: GenerationResult, output_dir: Path,
                       stem: str) -> dict[str, str]:
    """The A-vs-B and A-vs-fallback heatmaps and spectrogram differences, saved as PNGs; paths by name."""
    return {name: str(metrics.save_image(metrics.colorize(picture), output_dir / f"{stem}-{name}.png"))
            for name, picture in (("heat-ab", metrics.video_difference_map(ra.video, rb.video)),
                                  ("heat-afallback", metrics.video_difference_map(ra.video, rf.video)),
                                  ("spec-ab", metrics.spectrogram_difference(ra.audio, rb.audio)),
                                  ("spec-afallback", metrics.spectrogram_difference(ra.audio, rf.audio)))}


def run_equivalence(binder: AdapterBinder, request: GenerationRequest, adapter: LoRASettings, *, a: CheckSetting = DEFAULT_A,
                    b: CheckSetting = DEFAULT_B, outputs: Outputs, token: str | None = None,
                    on_step: Callable[[int, int], None] | None = None,
                    should_cancel: Callable[[], bool] | None = None,
                    on_phase: Callable[[str], None] | None = None, low_rank_only: bool = False,
                    previews: PreviewBoard | None = None) -> EquivalenceResult:
    """Run the fallback, A, the control (A's first denoising step again) and B; compare and save the media.
    ``low_rank_only``: B rescales only the low-rank parts (an adapter's exact deltas stay at A's strength, the
    comparison that is equivalent for such a file; ``adapters.parts.check_note`` says why).

    ``binder`` is the :class:`~h3app.backend.adapter_binding.AdapterBinder` of the held model. Every adapter is
    detached before and after, so the model is left at its bitwise base. Each column's mp4 is encoded on a second
    thread while the next column denoises. ``on_step(done, total)`` counts the whole check's denoising steps (a
    cancel says "cancelled after k of n steps" of the whole check). Files go to ``outputs``, the settings as it
    records them. ``previews``: a preview of each of the fallback, A and B after every evaluation, in columns of
    those names (the control step has none).
    """
    started = time.perf_counter()
    pipe, loaded, engine, ranks = prepared(binder, request, adapter, token)  # refuses an approximate backend first
    workflow = request.workflow
    total = len(FULL_RUNS) * request_evaluations(pipe, request) + CONTROL_STEPS
    settings = outputs.record({"request": request.to_json(), "adapter": loaded.provenance(), "a": a.label,
                               "b": b.label, "model": binder.model.name, "model_commit": binder.model.location.commit})
    output_dir = outputs.folder
    output_dir.mkdir(parents=True, exist_ok=True)
    stem = uuid.uuid4().hex[:12]
    runs = _CheckRuns(pipe, request, engine, ranks, total=total, settings=settings, output_dir=output_dir, stem=stem,
                      on_step=on_step, should_cancel=should_cancel, on_phase=on_phase, previews=previews)
    try:
        with deterministic(), binder.model.decode_cache.enabled():  # latents equal to A's are decoded once
            # The fallback first: its mp4 is encoded while A denoises, and A, the control and B then run back to
            # back with only the slider change (set_lora) between A and B; B's mp4, last, is normally a remux.
            engine.attach(with_rank_alpha(loaded.adapter),
                          dataclasses.replace(adapter, alpha=None, strength=1.0, mode=UNMERGED), CHECK_NAME)
            rf = runs.run("fallback")
            runs.encode("fallback", None, 1.0)
            engine.detach()
            engine.attach(loaded.adapter, dataclasses.replace(adapter, alpha=a.alpha, strength=a.strength,
                                                              mode=UNMERGED), CHECK_NAME)
            with first_output_digest(pipe, request) as first_a:
                ra = runs.run("A")
            runs.encode("A", a.alpha, a.strength)
            control_identical = runs.control(first_a[0])
            engine.set_lora(CHECK_NAME, alpha=b.alpha, strength=b.strength,
                            exact_strength=a.strength if low_rank_only else None)
            rb = runs.run("B")
            runs.encode("B", b.alpha, b.strength, same_as="A", last=True)
        return verdict(runs, (rf, ra, rb), control_identical, started, loaded.adapter.info.parts,
                       (a.strength, b.strength), low_rank_only)
    finally:
        runs.close()
        binder.baseline(workflow)  # detached; compiled: the adapter stays in place at strength 0


def prepared(binder: AdapterBinder, request: GenerationRequest, adapter: LoRASettings, token: str | None
             ) -> tuple[Any, Any, Any, dict[str, int]]:
    """A check's start, in one call or in each of its ZeroGPU calls: an approximate attention backend refused (every
    run uses the one loaded model's), every adapter detached, the check's adapter loaded. ``(pipe, loaded, engine,
    ranks per target)``."""
    refused = check_refusal(binder.model.attention)
    if refused is not None:
        raise H3AppError(refused)
    workflow = request.workflow
    pipe = binder.model.pipeline(workflow)
    binder.reset(workflow)
    loaded = binder.load(adapter, workflow, token)
    ranks = {target: module.rank for target, module in loaded.adapter.modules.items()}
    return pipe, loaded, binder.engine(workflow), ranks


def verdict(runs: _CheckRuns, results: tuple[GenerationResult, GenerationResult, GenerationResult],
            control_identical: bool, started: float, parts: Mapping[str, int], strengths: tuple[float, float],
            low_rank_only: bool) -> EquivalenceResult:
    """The check's result from its three runs ``(fallback, A, B)`` once their mp4s are queued on ``runs``: the
    difference images and metrics (drawn while the encoder finishes the last mp4), the finished columns, the verdict.
    The one-call check and the check split over ZeroGPU calls (``check_runs.assemble``) both end here."""
    rf, ra, rb = results
    paths = _difference_images(ra, rb, rf, runs.output_dir, runs.stem)
    a_vs_b = metrics.compare(ra.video, ra.audio, rb.video, rb.audio)
    a_vs_fallback = metrics.compare(ra.video, ra.audio, rf.video, rf.audio)
    done = runs.finished()
    return EquivalenceResult(
        identical=ra.hash == rb.hash, control_identical=control_identical,
        a=done["A"], b=done["B"], fallback=done["fallback"], a_vs_b=a_vs_b, a_vs_fallback=a_vs_fallback,
        heatmap_path=paths["heat-ab"], fallback_heatmap_path=paths["heat-afallback"],
        spectrogram_diff_path=paths["spec-ab"], fallback_spectrogram_diff_path=paths["spec-afallback"],
        seconds=time.perf_counter() - started, settings=runs.settings, seconds_per_run=ra.seconds,
        parts_note=check_note(parts, *strengths, low_rank_only), low_rank_only=low_rank_only, parts=dict(parts))


@contextmanager
def first_output_digest(pipe: Any, request: GenerationRequest) -> Iterator[list[str]]:
    """Inside the block, the digest of the transformer's first output (see :func:`output_digest`) is put in the
    yielded list: the reference the determinism control compares its one step against."""
    transformer = pipe.transformer_ref if request.workflow == REF2VA else pipe.transformer
    digests: list[str] = []

    def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if not digests:
            digests.append(output_digest(output))

    handle = transformer.register_forward_hook(hook, with_kwargs=True)
    try:
        yield digests
    finally:
        handle.remove()


@dataclass(frozen=True)
class FullCheck:
    """A full-mode check from the command line: which model, placed how, which adapter, which request."""

    model: str
    options: LoadOptions
    adapter: LoRASettings
    request: GenerationRequest
    a: CheckSetting = DEFAULT_A
    b: CheckSetting = DEFAULT_B
    low_rank_only: bool = False
    previews: PreviewBoard | None = None  # --preview-dir: DIR/A, DIR/B, DIR/fallback


def run_full_check(check: FullCheck, token: str | None = None) -> dict[str, Any]:
    """Load ``check.model`` and run :func:`run_equivalence` once; its JSON plus the model name and output folder."""
    import tempfile

    from ..model.loader import load_model
    from .adapter_binding import AdapterBinder

    model = load_model(check.model, check.request.workflow, check.options)
    output_dir = Path(tempfile.mkdtemp(prefix="h3app-check-"))
    result = run_equivalence(AdapterBinder(model), check.request, check.adapter, a=check.a, b=check.b,
                             outputs=Outputs(output_dir), token=token, low_rank_only=check.low_rank_only,
                             previews=check.previews)
    return {**result.to_json(), "model": model.name, "output_dir": str(output_dir)}
