"""The equivalence check one run at a time: a run in its own call (:func:`run_one`) and the verdict assembled from
the runs' arrays (:func:`assemble`), for a check split into ZeroGPU calls (``check_calls``).

A run repeats what ``equivalence.run_equivalence`` does at that point of the one-call check, from a model at its
base: the adapter loaded and attached unmerged (the fallback at alpha = rank, strength 1; A at A's alpha and
strength; B attached at A's then ``set_lora`` to B's, the one call's own path), deterministic algorithms and the
native attention backend, then the whole run (or, for the control, A's first denoising step). The verdict reuses the
one-call check's column writer and comparisons, so every field is the one call's.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..rules.check_pair import CheckSetting
from ..rules.choices import UNMERGED
from ..settings import LoRASettings
from .equivalence import (
    CHECK_NAME,
    PHASES,
    EquivalenceResult,
    _CheckRuns,
    deterministic,
    first_output_digest,
    prepared,
    verdict,
)
from .generation import GenerationRequest, GenerationResult, first_step_digest, run_generation
from .outputs import Outputs
from .preview import PreviewBoard
from .transformer_check import summarise_scales, with_rank_alpha
from .worker import Cancelled

if TYPE_CHECKING:
    from ..model.loader import LoadedModel
    from .adapter_binding import AdapterBinder


@dataclass(frozen=True)
class CheckRun:
    """One run of a split check, as it travels back from its call: the decoded ``result`` (None for the control),
    the effective ``scales`` it ran at, ``digest`` (A: its first step's transformer output; the control: its one
    step's), and the adapter's ``provenance`` and ``parts``."""

    label: str
    result: GenerationResult | None
    scales: Any
    digest: str
    provenance: dict[str, Any]
    parts: dict[str, int]

    # Pickling copies a strided array C-ordered, and numpy's sums follow the memory order: the decoded video (a
    # channel-planar view) travels with its axis order, so the verdict's PSNRs sum exactly as the one-call check's.
    def __getstate__(self) -> dict[str, Any]:
        return travelling(dict(vars(self)))

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in arrived(state).items():
            object.__setattr__(self, name, value)


def travelling(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (an object's fields) with its ``result``'s video as its buffer in memory order and the axis order
    beside it (no copy for a transposed contiguous array), so it arrives laid out as it left (:func:`arrived`)."""
    if state.get("result") is not None:
        video = state["result"].video
        axes = tuple(int(axis) for axis in np.argsort([-stride for stride in video.strides], kind="stable"))
        state["result"] = dataclasses.replace(state["result"], video=np.ascontiguousarray(video.transpose(axes)))
        state["video_axes"] = axes
    return state


def arrived(state: dict[str, Any]) -> dict[str, Any]:
    """A :func:`travelling` state as it left: the video back in its axis order."""
    axes = state.pop("video_axes", None)
    if axes is not None:
        result = state["result"]
        state["result"] = dataclasses.replace(result, video=result.video.transpose(tuple(np.argsort(axes))))
    return state


def run_one(binder: AdapterBinder, request: GenerationRequest, adapter: LoRASettings, label: str, a: CheckSetting,
            b: CheckSetting, *, token: str | None = None, low_rank_only: bool = False,
            on_step: Callable[[int, int], None] | None = None, should_cancel: Callable[[], bool] | None = None,
            on_phase: Callable[[str], None] | None = None, previews: PreviewBoard | None = None) -> CheckRun:
    """Run the check's ``label`` run (``equivalence.PHASES``) alone; the model is left at its base."""
    pipe, loaded, engine, ranks = prepared(binder, request, adapter, token)
    workflow = request.workflow
    result, digest = None, ""
    try:
        with deterministic(), binder.model.decode_cache.enabled():
            if label == "fallback":
                engine.attach(with_rank_alpha(loaded.adapter),
                              dataclasses.replace(adapter, alpha=None, strength=1.0, mode=UNMERGED), CHECK_NAME)
            else:
                engine.attach(loaded.adapter, dataclasses.replace(adapter, alpha=a.alpha, strength=a.strength,
                                                                  mode=UNMERGED), CHECK_NAME)
            if label == "B":
                engine.set_lora(CHECK_NAME, alpha=b.alpha, strength=b.strength,
                                exact_strength=a.strength if low_rank_only else None)
            if on_phase is not None:
                on_phase(f"{label} ({PHASES.index(label) + 1}/{len(PHASES)})")
            scales = summarise_scales(engine.effective_scales(CHECK_NAME), ranks)
            if label == "control":
                if should_cancel is not None and should_cancel():
                    raise Cancelled(0, 1)
                digest = first_step_digest(pipe, request)
                if on_step is not None:
                    on_step(1, 1)
            else:
                listeners = (previews.listener(pipe, label),) if previews is not None else ()
                with first_output_digest(pipe, request) as first:
                    result = run_generation(pipe, request, on_step=on_step, should_cancel=should_cancel,
                                            listeners=listeners)
                digest = first[0] if label == "A" else ""
    finally:
        binder.baseline(workflow)
    return CheckRun(label, result, scales, digest, loaded.provenance(), dict(loaded.adapter.info.parts))


def assemble(runs: dict[str, CheckRun], request: GenerationRequest, a: CheckSetting, b: CheckSetting,
             low_rank_only: bool, outputs: Outputs, model: LoadedModel, started: float) -> EquivalenceResult:
    """The verdict and media of a check from its runs, as ``run_equivalence`` computes them."""
    ra, rb, rf = (runs[label].result for label in ("A", "B", "fallback"))
    assert ra is not None and rb is not None and rf is not None
    settings = outputs.record({"request": request.to_json(), "adapter": runs["A"].provenance, "a": a.label,
                               "b": b.label, "model": model.name, "model_commit": model.location.commit})
    output_dir = outputs.folder
    output_dir.mkdir(parents=True, exist_ok=True)
    stem = uuid.uuid4().hex[:12]
    columns = _CheckRuns(None, request, None, {}, total=0, settings=settings, output_dir=output_dir, stem=stem,
                         on_step=None, should_cancel=None, on_phase=None)
    columns.results = {"fallback": rf, "A": ra, "B": rb}
    columns.scales = {label: runs[label].scales for label in ("fallback", "A", "B")}
    try:
        columns.encode("fallback", None, 1.0)
        columns.encode("A", a.alpha, a.strength)
        columns.encode("B", b.alpha, b.strength, same_as="A", last=True)
        return verdict(columns, (rf, ra, rb), runs["control"].digest == runs["A"].digest, started,
                       runs["A"].parts, (a.strength, b.strength), low_rank_only)
    finally:
        columns.close()
