"""The memory plan: the bytes one rehearsal counted, composed for each way of placing the model, judged against
every flavor.

Measured (fake CUDA, h3app's own code): each component's device weights in the requested dtype, the LoRA factors
the engine keeps on the device (fp32), merged mode's pristine host copies, and the transient bytes of each phase of
one request (text encoder, keyframe/reference encode, one denoising step, VAE and audio-VAE decode) — with fused
attention, as a GPU runs it. Composed from those numbers:

- ``none``: everything resident; the peak is all weights + LoRA + the largest phase transient (what the
  rehearsal itself measured).
- ``auto``: diffusers' ``ComponentsManager`` auto CPU offload moves one component at a time to the GPU, so each
  phase holds only its component (+ LoRA in the denoising step).
- ``group``: additionally the transformer streams one block at a time (one computing, one prefetched) beside its
  non-block weights.
- ``fp8``: transformer weights stored ``float8_e4m3fn`` by diffusers' ``enable_layerwise_casting`` (sizes from
  that very call on a meta model), each Linear upcast to the compute dtype for its own forward (the largest one
  is added to the step). LoRA stays exact unmerged; merged LoRA would round into fp8, so fp8 + merged is refused.
- context parallel over N ranks (``ulysses × ring``): the denoising step's activations split N ways; weights are
  not sharded (each GPU holds the whole transformer).

A flavor fits when the peak stays within its memory less ``RESERVE`` (CUDA context, allocator fragmentation).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from ..errors import H3AppError
from ..model import repo
from ..rules.h3_modules import transformer_shapes
from . import full_size
from .fake_cuda import PhaseBytes
from .flavors import FLAVORS, GB, Flavor, flavor
from .rehearsal import RESOLUTIONS, Rehearsal, RehearsalOptions, rehearse

OFFLOADS = ("none", "auto", "group")
RESERVE = 3 * GB
TINY_CANVAS = (64, 96)  # the embedded tiny checkpoint's largest canvas (6,144 pixels); --resolution is for full
TRANSFORMERS = ("transformer", "transformer_ref")
PHASE_COMPONENT = {"text_encoder": "text_encoder", "vae_encode": "vae", "vae_decode": "vae",
                   "audio_vae_encode": "audio_vae", "audio_vae_decode": "audio_vae"}


@dataclass(frozen=True)
class Placement:
    """How the weights sit on the GPU: offload mode, fp8 transformer storage, context-parallel ranks."""

    offload: str = "none"
    fp8: bool = False
    ranks: int = 1

    @property
    def label(self) -> str:
        parts = [f"--offload {self.offload}"] + (["--fp8"] if self.fp8 else [])
        return " ".join(parts)


@dataclass
class Measured:
    """A rehearsal's numbers, kept apart from the placement they are composed for."""

    rehearsal: Rehearsal
    weights: dict[str, int]
    fp8_transformer_bytes: int
    largest_linear_bytes: int
    block_bytes: int
    lora_bytes: int
    num_layers: int = 50


@dataclass
class Plan:
    """The plan for one option set (the ``plan --json`` object)."""

    model: str
    workflow: str
    resolution: str
    duration: float
    dtype: str
    placement: Placement
    lora_mode: str | None
    peak_gpu_bytes: int
    host_bytes: int
    components: dict[str, int]
    phases: dict[str, dict[str, int]]
    fits: dict[str, bool]
    recommended: dict[str, Any] | None
    targets_bound: int | None
    tokens: dict[str, int]
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    flops_per_evaluation: int = 0  # one transformer evaluation, counted on the rehearsal (``work.py``)
    predicted: dict[str, dict[str, float | None]] = field(default_factory=dict)  # flavor → ``roofline.predict``

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["placement"] = asdict(self.placement)
        data["offload"], data["fp8"] = self.placement.offload, self.placement.fp8
        return data


def measure(options: RehearsalOptions, model: str = full_size.FULL) -> Measured:
    """Rehearse ``options`` on ``model`` (``full`` or ``tiny``) with everything resident and keep the numbers."""
    if model == full_size.FULL:
        rehearsal = rehearse(replace(options, offload="none"))
        config = full_size.transformer_config()
    elif model == repo.TINY:
        from ..model.loader import _load_components

        small = replace(options, offload="none", size=options.size or TINY_CANVAS)
        rehearsal = rehearse(small, component_source=_load_components, pipeline_config=None,
                             location=repo.locate(repo.TINY, options.workflow))
        config = repo.read_transformer_config(repo.TINY, repo.partition_for(options.workflow))
    else:
        raise H3AppError(f"plan --model {model!r}: use full (the published MiniMax-H3 sizes) or tiny.")
    partition = repo.partition_for(options.workflow)
    weights = dict(rehearsal.components)
    fp8_bytes, block = _transformer_sizes(config, options)
    shapes = transformer_shapes(config)
    element = torch.empty((), dtype=options.dtype).element_size()
    largest = max(s.out_features * s.in_features for s in shapes.linears.values()) * element
    weights.setdefault(partition, 0)
    return Measured(rehearsal=rehearsal, weights=weights, fp8_transformer_bytes=fp8_bytes,
                    largest_linear_bytes=largest, block_bytes=block, lora_bytes=rehearsal.lora_bytes,
                    num_layers=shapes.num_layers)


def _transformer_sizes(config: dict[str, Any], options: RehearsalOptions) -> tuple[int, int]:
    """(bytes with diffusers' fp8 layerwise casting, bytes of the largest main block) from a meta model."""
    from ..model.loader import LoadOptions

    model = full_size.build_meta("transformer", LoadOptions(dtype=options.dtype, fuse_qkv=options.fuse_qkv), config)
    block = max(full_size.parameter_bytes(b) for b in model.transformer_blocks)
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=options.dtype)
    return full_size.parameter_bytes(model), block


def compose(measured: Measured, placement: Placement, lora_mode: str | None) -> tuple[int, dict[str, dict[str, int]]]:
    """Peak device bytes and per-phase ``{resident, transient, peak}`` of ``placement``."""
    rehearsal = measured.rehearsal
    partition = repo.partition_for(rehearsal.options.workflow)
    weights = dict(measured.weights)
    if placement.fp8:
        weights[partition] = measured.fp8_transformer_bytes
    transient = {name: bytes_.transient for name, bytes_ in rehearsal.phases.items()
                 if name not in ("load", "attach", "detach")}
    if "denoise" in transient:
        transient["denoise"] = transient["denoise"] // max(1, placement.ranks)
        if placement.fp8:
            transient["denoise"] += measured.largest_linear_bytes
    attach = rehearsal.phases.get("attach", PhaseBytes())
    lora = measured.lora_bytes if lora_mode else 0
    phases: dict[str, dict[str, int]] = {}
    for name, extra in transient.items():
        if placement.offload == "none":
            resident = sum(weights.values()) + lora
        elif name == "denoise":
            transformer = weights[partition]
            if placement.offload == "group":
                transformer = _non_block_bytes(measured, weights[partition]) + 2 * _block_bytes(measured, placement)
            resident = transformer + lora
        else:
            resident = weights.get(PHASE_COMPONENT.get(name, name), 0)
        phases[name] = {"resident": resident, "transient": extra, "peak": resident + extra}
    if lora_mode:
        resident = sum(weights.values()) if placement.offload == "none" else weights[partition]
        phases["attach"] = {"resident": resident, "transient": attach.transient, "peak": resident + attach.transient}
    peak = max((p["peak"] for p in phases.values()), default=sum(weights.values()))
    return peak, phases


def _block_bytes(measured: Measured, placement: Placement) -> int:
    return measured.block_bytes // 2 if placement.fp8 else measured.block_bytes


def _non_block_bytes(measured: Measured, transformer_bytes: int) -> int:
    return max(0, transformer_bytes - measured.num_layers * measured.block_bytes)


def host_bytes(measured: Measured, placement: Placement, lora_mode: str | None) -> int:
    """Host RAM: offloaded weights live there; merged mode's pristine copies; the decoded request."""
    rehearsal = measured.rehearsal
    offloaded = sum(measured.weights.values()) if placement.offload != "none" else max(measured.weights.values())
    pristine = rehearsal.pristine_host_bytes if lora_mode == "merged" else 0
    return offloaded + pristine + rehearsal.host_peak - rehearsal.pristine_host_bytes


def fits(peak: int, hardware: Flavor, placement: Placement) -> bool:
    if placement.ranks > hardware.gpus:
        return False
    return peak <= hardware.gpu_bytes - RESERVE


PREFERENCE = (Placement("none"), Placement("none", fp8=True), Placement("auto"), Placement("auto", fp8=True),
              Placement("group"), Placement("group", fp8=True))


def recommend(measured: Measured, lora_mode: str | None, ranks: int = 1) -> dict[str, Any] | None:
    """The smallest flavor with the fastest placement that fits it (None: nothing fits). ZeroGPU is judged in
    ``fits`` but never recommended: h3app's one worker holds the GPU for its lifetime (docs/hardware.md)."""
    for hardware in FLAVORS:
        if hardware.zero_gpu:
            continue
        for placement in PREFERENCE:
            placement = replace(placement, ranks=ranks)
            if placement.fp8 and lora_mode == "merged":
                continue
            peak, _ = compose(measured, placement, lora_mode)
            if fits(peak, hardware, placement):
                return {"hardware": hardware.name, "space_hardware": hardware.space, "offload": placement.offload,
                        "fp8": placement.fp8, "peak_gpu_bytes": peak, "gpu_bytes": hardware.gpu_bytes,
                        "options": placement.label}
    return None


def make_plan(options: RehearsalOptions, placement: Placement, *, model: str = full_size.FULL,
              hardware: str | None = None, measured: Measured | None = None) -> Plan:
    """Rehearse, compose for ``placement``, judge every flavor (or only ``hardware``), recommend."""
    started = time.perf_counter()
    if options.resolution not in RESOLUTIONS:
        raise H3AppError(f"resolution must be one of {', '.join(RESOLUTIONS)}, got {options.resolution!r}.")
    if placement.offload not in OFFLOADS:
        raise H3AppError(f"offload must be one of {', '.join(OFFLOADS)}, got {placement.offload!r}.")
    lora_mode = options.lora_mode if options.adapter is not None else None
    if placement.fp8 and lora_mode == "merged":
        raise H3AppError("fp8 storage keeps LoRA exact only unmerged (a merge would round into fp8): "
                         "use --lora-mode unmerged, or drop --fp8.")
    judged = (flavor(hardware),) if hardware else FLAVORS
    measured = measured or measure(options, model)
    peak, phases = compose(measured, placement, lora_mode)
    rehearsal = measured.rehearsal
    components = dict(measured.weights)
    if placement.fp8:
        components[repo.partition_for(options.workflow)] = measured.fp8_transformer_bytes
    if lora_mode:
        components["lora_factors"] = measured.lora_bytes
    warnings = _warnings(measured, placement, lora_mode, peak)
    return Plan(
        model=model, workflow=options.workflow, resolution=options.resolution, duration=options.duration,
        dtype=str(options.dtype).replace("torch.", ""), placement=placement, lora_mode=lora_mode,
        peak_gpu_bytes=peak, host_bytes=host_bytes(measured, placement, lora_mode), components=components,
        phases=phases, fits={f.name: fits(peak, f, placement) for f in judged},
        recommended=recommend(measured, lora_mode, placement.ranks),
        targets_bound=rehearsal.targets_bound if options.adapter is not None else None,
        tokens=dict(rehearsal.tokens), warnings=warnings, seconds=round(time.perf_counter() - started, 2),
        **_speed(measured, placement, lora_mode, judged))


def _speed(measured: Measured, placement: Placement, lora_mode: str | None, judged) -> dict[str, Any]:
    """The plan's speed fields: FLOPs per evaluation and the roofline prediction per judged flavor."""
    from .roofline import flops_per_evaluation, predict

    return {"flops_per_evaluation": sum(flops_per_evaluation(measured.rehearsal).values()),
            "predicted": predict(measured, placement, lora_mode, judged)}


def _warnings(measured: Measured, placement: Placement, lora_mode: str | None, peak: int) -> list[str]:
    warnings = []
    if not any(fits(peak, f, placement) for f in FLAVORS):
        warnings.append(f"{placement.label} needs {peak / GB:.1f} GB on one GPU: no flavor has that much; "
                        f"see `recommended`.")
    if lora_mode == "merged":
        warnings.append(f"merged mode keeps pristine copies of the bound weights in host RAM "
                        f"({measured.rehearsal.pristine_host_bytes / GB:.1f} GB).")
    if placement.offload != "none":
        warnings.append(f"offload keeps the offloaded weights in host RAM "
                        f"({sum(measured.weights.values()) / GB:.1f} GB): the box needs that much free.")
    return warnings
