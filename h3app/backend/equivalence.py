"""The equivalence check, full mode: the whole pipeline under settings A, B, the old fallback and an A-vs-A control.

Same seed, same prompt embedding (encoded once through the prompt cache), unmerged, deterministic algorithms on and
diffusers' ``native`` attention backend. The decode cache is on for the check: a column whose latents are bitwise
equal to an earlier column's reuses its decoded output (so the control checks that denoising is deterministic). Hashes are sha256 over the decoded fp32 video then audio (docs/architecture.md,
decision 10). A (default alpha 8 / strength 1.0) and B (alpha 128 / strength 0.0625) have the same alpha × strength,
so they must be bit-identical; the fallback column is the same adapter at alpha = rank, strength 1 — what the old
loaders did — which is 16× stronger for LightX2V's rank-128 Turbo.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from .transformer_check import CheckSetting, summarise_scales, with_rank_alpha
from ..model.loader import LoadOptions
from ..settings import LoRASettings
from . import metrics
from .generation import GenerationRequest, GenerationResult, run_generation, save_result
from .media import remux_with_settings, write_thumbnail

CHECK_NAME = "equivalence-check"
DEFAULT_A = CheckSetting(alpha=8.0, strength=1.0)
DEFAULT_B = CheckSetting(alpha=128.0, strength=0.0625)
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
            "mode": "full",
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


def run_equivalence(binder: Any, request: GenerationRequest, adapter: LoRASettings, *, a: CheckSetting = DEFAULT_A,
                    b: CheckSetting = DEFAULT_B, output_dir: Path, token: str | None = None,
                    on_step: Callable[[int, int], None] | None = None,
                    should_cancel: Callable[[], bool] | None = None,
                    on_phase: Callable[[str], None] | None = None) -> EquivalenceResult:
    """Run A, A again (control), B and the fallback through the full pipeline; compare and save the media.

    ``binder`` is the :class:`~h3app.backend.adapter_binding.AdapterBinder` of the held model. Every adapter is
    detached before and after, so the model is left at its bitwise base.
    """
    started = time.perf_counter()
    workflow = request.workflow
    pipe = binder.model.pipeline(workflow)
    binder.reset(workflow)
    loaded = binder.load(adapter, workflow, token)
    engine = binder.engine(workflow)
    ranks = {target: module.rank for target, module in loaded.adapter.modules.items()}
    runs: dict[str, GenerationResult] = {}
    scales: dict[str, Any] = {}
    phases = (("A", a), ("control", a), ("B", b), ("fallback", None))
    step_offset = [0]

    def column_step(done: int, total: int) -> None:
        if on_step is not None:
            on_step(step_offset[0] + done, total * len(phases))

    try:
        with deterministic(), binder.model.decode_cache.enabled():  # latents equal to A's are decoded once
            engine.attach(loaded.adapter, dataclasses.replace(adapter, alpha=a.alpha, strength=a.strength,
                                                              mode="unmerged"), CHECK_NAME)
            for index, (label, setting) in enumerate(phases):
                if on_phase is not None:
                    on_phase(f"{label} ({index + 1}/{len(phases)})")
                if label == "B":
                    engine.set_lora(CHECK_NAME, alpha=b.alpha, strength=b.strength)
                if label == "fallback":
                    engine.detach()
                    engine.attach(with_rank_alpha(loaded.adapter),
                                  dataclasses.replace(adapter, alpha=None, strength=1.0, mode="unmerged"), CHECK_NAME)
                scales[label] = summarise_scales(engine.effective_scales(CHECK_NAME), ranks)
                runs[label] = run_generation(pipe, request, on_step=column_step, should_cancel=should_cancel)
                step_offset[0] += runs[label].evaluations
    finally:
        binder.reset(workflow)

    settings = {"request": request.to_json(), "adapter": loaded.provenance(), "a": a.label, "b": b.label,
                "model": binder.model.name, "model_commit": binder.model.location.commit}
    output_dir.mkdir(parents=True, exist_ok=True)
    stem = uuid.uuid4().hex[:12]

    def column(label: str, alpha: float | None, strength: float, same_as: Column | None = None) -> Column:
        result = runs[label]
        metadata = {**settings, "column": label, "alpha": alpha, "strength": strength, "hash": result.hash}
        path = output_dir / f"{stem}-{label}.mp4"
        if same_as is not None and same_as.hash == result.hash:  # bit-identical: copy the streams, no re-encode
            video = remux_with_settings(same_as.video_path, path, metadata)
            thumb = Path(same_as.thumbnail_path)
        else:
            video = save_result(result, path, metadata)
            thumb = write_thumbnail(output_dir / f"{stem}-{label}.png", result.video)
        return Column(label, alpha, strength, str(video), str(thumb), result.hash, scales[label])

    col_a = column("A", a.alpha, a.strength)
    col_b = column("B", b.alpha, b.strength, same_as=col_a)
    col_fallback = column("fallback", None, 1.0)
    ra, rb, rf = runs["A"], runs["B"], runs["fallback"]
    heat = metrics.save_image(metrics.colorize(metrics.video_difference_map(ra.video, rb.video)),
                              output_dir / f"{stem}-heat-ab.png")
    heat_fb = metrics.save_image(metrics.colorize(metrics.video_difference_map(ra.video, rf.video)),
                                 output_dir / f"{stem}-heat-afallback.png")
    spec = metrics.save_image(metrics.colorize(metrics.spectrogram_difference(ra.audio, rb.audio)),
                              output_dir / f"{stem}-spec-ab.png")
    spec_fb = metrics.save_image(metrics.colorize(metrics.spectrogram_difference(ra.audio, rf.audio)),
                                 output_dir / f"{stem}-spec-afallback.png")
    return EquivalenceResult(
        identical=ra.hash == rb.hash,
        control_identical=ra.hash == runs["control"].hash,
        a=col_a, b=col_b, fallback=col_fallback,
        a_vs_b=metrics.compare(ra.video, ra.audio, rb.video, rb.audio),
        a_vs_fallback=metrics.compare(ra.video, ra.audio, rf.video, rf.audio),
        heatmap_path=str(heat), fallback_heatmap_path=str(heat_fb),
        spectrogram_diff_path=str(spec), fallback_spectrogram_diff_path=str(spec_fb),
        seconds=time.perf_counter() - started, settings=settings,
    )


@dataclass(frozen=True)
class FullCheck:
    """A full-mode check from the command line: which model, placed how, which adapter, which request."""

    model: str
    options: LoadOptions
    adapter: LoRASettings
    request: GenerationRequest
    a: CheckSetting = DEFAULT_A
    b: CheckSetting = DEFAULT_B


def run_full_check(check: FullCheck, token: str | None = None) -> dict[str, Any]:
    """Load ``check.model`` and run :func:`run_equivalence` once; its JSON plus the model name and output folder."""
    import tempfile

    from ..model.loader import load_model
    from .adapter_binding import AdapterBinder

    model = load_model(check.model, check.request.workflow, check.options)
    output_dir = Path(tempfile.mkdtemp(prefix="h3app-check-"))
    result = run_equivalence(AdapterBinder(model), check.request, check.adapter, a=check.a, b=check.b,
                             output_dir=output_dir, token=token)
    return {**result.to_json(), "model": model.name, "output_dir": str(output_dir)}
