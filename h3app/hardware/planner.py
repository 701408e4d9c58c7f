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
- ``fp8``: transformer weights stored ``float8_e4m3fn`` by diffusers' layerwise casting (``model/fp8.py``; sizes
  from that very call on a meta model), each Linear upcast to the compute dtype for its own forward (the largest
  one is added to the step). LoRA stays exact unmerged; merged LoRA would round into fp8, so fp8 + merged is
  refused. ``fp8_text_encoder``: the same for the conditioner's decoder layers (its largest Linear is added to
  the text-encoder phase).
- context parallel over N ranks (``ulysses × ring``): the denoising step's activations split N ways; weights are
  not sharded (each GPU holds the whole transformer).

The conditioner is counted as the loader holds it: cut to the layers the pipeline reads (``model/conditioner.py``).

Host RAM (``host_bytes``): the loader reads each component into host RAM in the load dtype before it is cut,
cast or moved. Without offload it places one component at a time, so the host holds the largest one as loaded
(the whole conditioner before its cut, or the transformer before its fp8 cast); with offload everything stays
there, and the transformer (loaded last) arrives in the load dtype beside the others. Add merged mode's pristine
copies and the request's decoded arrays.

A flavor fits when the GPU peak stays within one GPU's memory less ``RESERVE`` (CUDA context, allocator
fragmentation) and the host need within its RAM less ``HOST_RESERVE`` (the OS, the Python process and its
libraries). ZeroGPU publishes no host RAM: its host is not judged (``fits_host`` None).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from ..errors import H3AppError
from ..model import repo
from ..rules.choices import MAIN_PARTITION, OFFLOAD_MODES
from ..rules.h3_modules import transformer_shapes
from . import full_size
from .fake_cuda import PhaseBytes
from .flavors import BY_PRICE, FLAVORS, GB, Flavor, flavor
from .rehearsal import PHASE_COMPONENT, RESOLUTIONS, Rehearsal, RehearsalOptions, rehearse

RESERVE = 3 * GB
HOST_RESERVE = 4 * GB
TINY_CANVAS = (64, 96)  # the embedded tiny checkpoint's largest canvas (6,144 pixels); --resolution is for full


@dataclass(frozen=True)
class Placement:
    """How the weights sit on the GPU: offload mode, fp8 storage of the transformer and of the conditioner,
    context-parallel ranks (``ring`` of them by ring attention, the rest by Ulysses). ``label`` is the command-line
    flags that load it (app.py, generate, check, grid)."""

    offload: str = "none"
    fp8: bool = False
    ranks: int = 1
    fp8_text_encoder: bool = False
    ring: int = 1

    @property
    def label(self) -> str:
        ulysses = self.ranks // self.ring
        parts = ([f"--offload {self.offload}"] + (["--fp8"] if self.fp8 else [])
                 + (["--fp8-text-encoder"] if self.fp8_text_encoder else [])
                 + ([f"--ulysses {ulysses}"] if ulysses > 1 else [])
                 + ([f"--ring {self.ring}"] if self.ring > 1 else []))
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
    fp8_text_encoder_bytes: int = 0  # the cut conditioner with fp8 decoder layers
    largest_text_encoder_linear_bytes: int = 0  # in the compute dtype: one upcast at a time
    text_encoder_load_bytes: int = 0  # the whole conditioner as read from disk, before its cut


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
    flavors: list[dict[str, Any]]
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
        data["fp8_text_encoder"] = self.placement.fp8_text_encoder
        return data


def measure(options: RehearsalOptions, model: str = full_size.FULL) -> Measured:
    """Rehearse ``options`` on ``model`` (``full`` or ``tiny``) with everything resident and keep the numbers."""
    if model == full_size.FULL:
        rehearsal = rehearse(replace(options, offload="none"))
        config = full_size.transformer_config()
        conditioner_config, folder = None, full_size.location().folder
    elif model == repo.TINY:
        from transformers import Qwen3VLConfig

        from ..model.loader import _load_components

        small = replace(options, offload="none", size=options.size or TINY_CANVAS)
        location = repo.locate(repo.TINY, options.workflow)
        rehearsal = rehearse(small, component_source=_load_components, pipeline_config=None, location=location)
        config = repo.read_transformer_config(repo.TINY, repo.partition_for(options.workflow))
        conditioner_config = Qwen3VLConfig.from_pretrained(str(location.folder / "text_encoder"))
        folder = location.folder
    else:
        raise H3AppError(f"plan --model {model!r}: use full (the published MiniMax-H3 sizes) or tiny.")
    partition = repo.partition_for(options.workflow)
    weights = dict(rehearsal.components)
    fp8_bytes, block = _transformer_sizes(config, options)
    shapes = transformer_shapes(config)
    element = torch.empty((), dtype=options.dtype).element_size()
    largest = max(s.out_features * s.in_features for s in shapes.linears.values()) * element
    weights.setdefault(partition, 0)
    whole, fp8_conditioner, conditioner_linear = _text_encoder_sizes(conditioner_config, folder, options)
    return Measured(rehearsal=rehearsal, weights=weights, fp8_transformer_bytes=fp8_bytes,
                    largest_linear_bytes=largest, block_bytes=block, lora_bytes=rehearsal.lora_bytes,
                    num_layers=shapes.num_layers, fp8_text_encoder_bytes=fp8_conditioner,
                    largest_text_encoder_linear_bytes=conditioner_linear, text_encoder_load_bytes=whole)


def _text_encoder_sizes(config: Any, folder: Any, options: RehearsalOptions) -> tuple[int, int, int]:
    """(bytes of the whole conditioner as loaded, bytes of the cut one with fp8 decoder layers, bytes of its
    largest decoder Linear in the compute dtype), from meta models built as the loader builds them."""
    from ..model import conditioner
    from ..model.loader import LoadOptions

    load = LoadOptions(dtype=options.dtype)
    whole = full_size.build_meta("text_encoder", load, config)
    whole_bytes = full_size.parameter_bytes(whole)
    layers = conditioner.layers_read_from(str(folder))
    linears = [m for m in conditioner.decoder(whole).layers[0].modules() if isinstance(m, torch.nn.Linear)]
    largest = max(m.weight.numel() for m in linears) * torch.empty((), dtype=options.dtype).element_size()
    with_fp8 = full_size.build_text_encoder(replace(load, fp8_text_encoder=True), layers, config)
    return whole_bytes, full_size.parameter_bytes(with_fp8), largest


def _transformer_sizes(config: dict[str, Any], options: RehearsalOptions) -> tuple[int, int]:
    """(bytes with diffusers' fp8 layerwise casting, bytes of the largest main block) from a meta model."""
    from ..model import fp8
    from ..model.loader import LoadOptions

    model = full_size.build_meta(MAIN_PARTITION, LoadOptions(dtype=options.dtype, fuse_qkv=options.fuse_qkv), config)
    block = max(full_size.parameter_bytes(b) for b in model.transformer_blocks)
    fp8.store_transformer(model, options.dtype)
    return full_size.parameter_bytes(model), block


def placed_weights(measured: Measured, placement: Placement) -> dict[str, int]:
    """Each component's bytes as ``placement`` stores them (fp8 where it says so)."""
    weights = dict(measured.weights)
    if placement.fp8:
        weights[repo.partition_for(measured.rehearsal.options.workflow)] = measured.fp8_transformer_bytes
    if placement.fp8_text_encoder and "text_encoder" in weights:
        weights["text_encoder"] = measured.fp8_text_encoder_bytes
    return weights


def compose(measured: Measured, placement: Placement, lora_mode: str | None) -> tuple[int, dict[str, dict[str, int]]]:
    """Peak device bytes and per-phase ``{resident, transient, peak}`` of ``placement``."""
    rehearsal = measured.rehearsal
    partition = repo.partition_for(rehearsal.options.workflow)
    weights = placed_weights(measured, placement)
    transient = {name: bytes_.transient for name, bytes_ in rehearsal.phases.items()
                 if name not in ("load", "attach", "detach")}
    if "denoise" in transient:
        transient["denoise"] = transient["denoise"] // max(1, placement.ranks)
        if placement.fp8:
            transient["denoise"] += measured.largest_linear_bytes
    if "text_encoder" in transient and placement.fp8_text_encoder:
        transient["text_encoder"] += measured.largest_text_encoder_linear_bytes
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
    """Host RAM at its peak: the weights while loading (see the module docstring), merged mode's pristine copies,
    the decoded request."""
    rehearsal = measured.rehearsal
    partition = repo.partition_for(rehearsal.options.workflow)
    placed = placed_weights(measured, placement)
    as_loaded = {**measured.weights, "text_encoder": max(measured.weights.get("text_encoder", 0),
                                                         measured.text_encoder_load_bytes)}
    if placement.offload == "none":
        loading = max(as_loaded.values())
    else:
        loading = max(as_loaded["text_encoder"], sum(placed.values()) - placed[partition] + as_loaded[partition])
    pristine = rehearsal.pristine_host_bytes if lora_mode == "merged" else 0
    return loading + pristine + rehearsal.host_peak - rehearsal.pristine_host_bytes


def fits(peak: int, hardware: Flavor, placement: Placement) -> bool:
    """The GPU judgement: ``peak`` within one GPU less ``RESERVE``, and enough GPUs for the ranks."""
    if placement.ranks > hardware.gpus:
        return False
    return peak <= hardware.gpu_bytes - RESERVE


def fits_host(host: int, hardware: Flavor) -> bool | None:
    """The host judgement: ``host`` within the box's RAM less ``HOST_RESERVE``; None where none is published."""
    if hardware.host_bytes is None:
        return None
    return host <= hardware.host_bytes - HOST_RESERVE


def judge(peak: int, host: int, hardware: Flavor, placement: Placement) -> dict[str, Any]:
    """One ``flavors`` row of ``plan --json``: the box's published numbers and both verdicts."""
    gpu_ok, host_ok = fits(peak, hardware, placement), fits_host(host, hardware)
    return {"name": hardware.name, "space_hardware": hardware.space_hardware, "gpu": hardware.gpu,
            "gpus": hardware.gpus, "gpu_bytes": hardware.gpu_bytes, "host_bytes": hardware.host_bytes,
            "usd_per_hour": hardware.usd_per_hour, "fits_gpu": gpu_ok, "fits_host": host_ok,
            "fits": gpu_ok and host_ok is not False}


# Fastest first: everything resident beats moving weights over PCIe, and fp8's per-layer upcast costs less than
# offload's copies; the conditioner runs once per request, so its fp8 costs least of all.
PREFERENCE = tuple(Placement(offload, fp8=fp8, fp8_text_encoder=both)
                   for offload in OFFLOAD_MODES for fp8, both in ((False, False), (True, False), (True, True)))


def recommend(measured: Measured, lora_mode: str | None, ranks: int = 1, ring: int = 1) -> dict[str, Any] | None:
    """The cheapest flavor whose GPU and host both fit, with the fastest placement that fits it at the request's
    context-parallel ``ranks`` (``ring`` of them by ring attention); None: nothing fits. ``host_bytes`` is the
    placement's host need, ``host_ram_bytes`` the box's. ZeroGPU is judged in ``fits`` but never recommended
    (docs/hardware.md: why h3app does not run on it)."""
    for hardware in BY_PRICE:
        for placement in PREFERENCE:
            placement = replace(placement, ranks=ranks, ring=ring)
            if placement.fp8 and lora_mode == "merged":
                continue
            peak, _ = compose(measured, placement, lora_mode)
            host = host_bytes(measured, placement, lora_mode)
            if judge(peak, host, hardware, placement)["fits"]:
                return {"hardware": hardware.name, "space_hardware": hardware.space_hardware,
                        "offload": placement.offload, "fp8": placement.fp8,
                        "fp8_text_encoder": placement.fp8_text_encoder, "peak_gpu_bytes": peak,
                        "gpu_bytes": hardware.gpu_bytes, "host_bytes": host, "host_ram_bytes": hardware.host_bytes,
                        "usd_per_hour": hardware.usd_per_hour,
                        "options": run_options(placement, dtype_name(measured.rehearsal.options.dtype))}
    return None


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``bfloat16``: how ``--dtype`` and ``plan --json`` name it."""
    return str(dtype).removeprefix("torch.")


def run_options(placement: Placement, dtype: str) -> str:
    """The flags that run ``placement`` on a GPU box, for app.py and every command alike: the device and ``dtype``
    the plan was made for, then the placement's own (offload needs ``--device cuda``)."""
    return f"--device cuda --dtype {dtype} {placement.label}"


def make_plan(options: RehearsalOptions, placement: Placement, *, model: str = full_size.FULL,
              hardware: str | None = None, measured: Measured | None = None) -> Plan:
    """Rehearse, compose for ``placement``, judge every flavor (or only ``hardware``), recommend."""
    started = time.perf_counter()
    if options.resolution not in RESOLUTIONS:
        raise H3AppError(f"resolution must be one of {', '.join(RESOLUTIONS)}, got {options.resolution!r}.")
    if placement.offload not in OFFLOAD_MODES:
        raise H3AppError(f"offload must be one of {', '.join(OFFLOAD_MODES)}, got {placement.offload!r}.")
    lora_mode = options.lora_mode if options.adapter is not None else None
    if placement.fp8 and lora_mode == "merged":
        raise H3AppError("fp8 storage keeps LoRA exact only unmerged (a merge would round into fp8): "
                         "use --lora-mode unmerged, or drop --fp8.")
    judged = (flavor(hardware),) if hardware else FLAVORS
    measured = measured or measure(options, model)
    peak, phases = compose(measured, placement, lora_mode)
    host = host_bytes(measured, placement, lora_mode)
    rehearsal = measured.rehearsal
    components = placed_weights(measured, placement)
    if lora_mode:
        components["lora_factors"] = measured.lora_bytes
    rows = [judge(peak, host, f, placement) for f in judged]
    warnings = _warnings(measured, placement, lora_mode, peak, host)
    return Plan(
        model=model, workflow=options.workflow, resolution=options.resolution, duration=options.duration,
        dtype=dtype_name(options.dtype), placement=placement, lora_mode=lora_mode,
        peak_gpu_bytes=peak, host_bytes=host, components=components,
        phases=phases, fits={row["name"]: row["fits"] for row in rows}, flavors=rows,
        recommended=recommend(measured, lora_mode, placement.ranks, placement.ring),
        targets_bound=rehearsal.targets_bound if options.adapter is not None else None,
        tokens=dict(rehearsal.tokens), warnings=warnings, seconds=round(time.perf_counter() - started, 2),
        **_speed(measured, placement, lora_mode, judged))


def _speed(measured: Measured, placement: Placement, lora_mode: str | None, judged) -> dict[str, Any]:
    """The plan's speed fields: FLOPs per evaluation and the roofline prediction per judged flavor."""
    from .roofline import flops_per_evaluation, predict

    return {"flops_per_evaluation": sum(flops_per_evaluation(measured.rehearsal).values()),
            "predicted": predict(measured, placement, lora_mode, judged)}


def _warnings(measured: Measured, placement: Placement, lora_mode: str | None, peak: int,
              host: int) -> list[str]:
    warnings = []
    if not any(fits(peak, f, placement) for f in FLAVORS):
        warnings.append(f"{placement.label} needs {peak / GB:.1f} GB on one GPU: no flavor has that much; "
                        f"see `recommended`.")
    elif not any(judge(peak, host, f, placement)["fits"] for f in FLAVORS):
        warnings.append(f"{placement.label} fits some GPUs but no box with {host / GB:.1f} GB of host RAM "
                        f"beside them; see `recommended`.")
    if lora_mode == "merged":
        warnings.append(f"merged mode keeps pristine copies of the bound weights in host RAM "
                        f"({measured.rehearsal.pristine_host_bytes / GB:.1f} GB).")
    if placement.offload != "none":
        warnings.append(f"offload keeps the offloaded weights in host RAM "
                        f"({sum(placed_weights(measured, placement).values()) / GB:.1f} GB): the box needs that "
                        f"much free.")
    return warnings
