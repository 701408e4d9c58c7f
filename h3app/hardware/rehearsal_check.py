"""The equivalence check rehearsed at full size: the backend's own ``run_equivalence`` (the fallback at alpha = rank,
A, the determinism control, B) on fake CUDA, with its adapter normalised from a safetensors header.

What it proves: every part of the check — the attach at A, ``set_lora`` from A to B, the fallback's re-attach, the
control step, each column's denoising step and decodes, the media written — places, casts and shapes tensors as a
GPU needs them (a cpu tensor meeting a cuda one raises). What it cannot prove is the comparison: fake tensors have
no values (their host copies read as zeros, so every hash is equal whatever the settings). The result therefore
carries only what is real — which runs ran, their evaluations, the targets bound and the effective scales
(arithmetic on alpha, strength and rank) — and says the comparison is not measurable here; ``bench/gpu.py``
measures it on a GPU. Decodes are never reused (the rehearsal's decode cache keeps nothing: a digest of fake
latents would match every column). Where the check would measure norms (the fallback's alpha suggestion) the LoRA engine skips the measurement
on fake tensors, as it does on meta ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..adapters import source as sources
from ..adapters.types import HeaderView
from ..backend.adapter_binding import AdapterBinder, LoadedAdapter
from ..backend.equivalence import run_equivalence
from ..backend.outputs import Outputs
from ..model import repo
from ..model.loader import LoadedModel
from ..request import GenerationRequest
from ..rules.check_pair import DEFAULT_A, DEFAULT_B, CheckSetting
from ..rules.choices import T2VA, UNMERGED
from ..settings import LoRASettings
from .header_adapter import adapter_from_header, factor_bytes

UNMEASURABLE = ("not measurable on fake tensors (they carry shapes, not values): this rehearsal proves devices, "
                "dtypes and shapes; bench/gpu.py measures A vs B on a GPU")


@dataclass(frozen=True)
class CheckRehearsal:
    """What the check ran on fake CUDA. ``evaluations``: transformer evaluations of the whole check (three runs
    plus the control step); ``effective_scale_*``: alpha × strength / rank per column (one number, or per rank)."""

    a: str
    b: str
    phases: tuple[str, ...]
    evaluations: int
    effective_scale_a: float | dict[str, float]
    effective_scale_b: float | dict[str, float]
    effective_scale_fallback: float | dict[str, float]
    targets_bound: int
    lora_bytes: int
    comparison: str = UNMEASURABLE

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "phases": list(self.phases), "evaluations": self.evaluations,
                "effective_scale_a": self.effective_scale_a, "effective_scale_b": self.effective_scale_b,
                "effective_scale_fallback": self.effective_scale_fallback, "targets_bound": self.targets_bound,
                "lora_bytes": self.lora_bytes,
                "comparison": self.comparison}


class HeaderBinder(AdapterBinder):
    """An :class:`AdapterBinder` whose one adapter is normalised from ``header`` (fake factors) instead of a file;
    everything else — engines, attach, reset — is the binder's own. The file it reports is a small JSON record
    of the header (its name, size and tensor shapes), written into ``folder``."""

    def __init__(self, model: LoadedModel, header: HeaderView, folder: Path) -> None:
        super().__init__(model)
        self._header = header
        self.loaded: LoadedAdapter | None = None
        self._record = folder / f"{Path(header.name).stem}.header.json"
        self._record.write_text(json.dumps({"name": header.name, "file_bytes": header.file_bytes,
                                            "tensors": {k: [d, list(s)] for k, (d, s) in header.tensors.items()}}))

    def load(self, settings: LoRASettings, workflow: str = T2VA, token: str | None = None,
             progress: Callable[[int, int | None], None] | None = None) -> LoadedAdapter:
        adapter = adapter_from_header(self._header, self.shapes(workflow), partition=repo.partition_for(workflow),
                                      qkv_layout=settings.qkv_layout)
        file = sources.AdapterFile(path=self._record, adapter_config_path=None, repo_id=None, revision=None,
                                   commit=None, filename=self._header.name, size=self._header.file_bytes)
        self.loaded = LoadedAdapter(settings=settings, file=file, adapter=adapter)
        return self.loaded


def rehearse_check(loaded: LoadedModel, header: HeaderView, request: GenerationRequest, folder: Path, *,
                   a: CheckSetting = DEFAULT_A, b: CheckSetting = DEFAULT_B) -> CheckRehearsal:
    """Run the backend's equivalence check on ``loaded`` (fake CUDA is on for this thread) with ``header``'s
    adapter; media go to ``folder``. The model is left without adapters, as the check leaves it."""
    binder = HeaderBinder(loaded, header, folder)
    phases: list[str] = []
    steps = [0]

    def on_step(done: int, _: int) -> None:
        steps[0] = max(steps[0], done)

    settings = LoRASettings(source=header.name, mode=UNMERGED)
    result = run_equivalence(binder, request, settings, a=a, b=b, outputs=Outputs(folder / "check"), on_step=on_step,
                             on_phase=lambda label: phases.append(label.split(" ")[0]))
    held = binder.loaded
    if held is None:
        raise RuntimeError("the rehearsed check never loaded the header's adapter")
    bound = binder.engine(request.workflow).match(held.adapter, settings).matched
    return CheckRehearsal(a=a.label, b=b.label, phases=tuple(phases), evaluations=steps[0],
                          effective_scale_a=result.a.effective_scale, effective_scale_b=result.b.effective_scale,
                          effective_scale_fallback=result.fallback.effective_scale, targets_bound=len(bound),
                          lora_bytes=factor_bytes(held.adapter))
