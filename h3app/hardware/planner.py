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

from dataclasses import dataclass, replace
from typing import Any

import torch

from ..errors import H3AppError
from ..lru import LRU
from ..model import repo
from ..rules.choices import MAIN_PARTITION, MERGED, OFFLOAD_MODES
from ..rules.h3_modules import transformer_shapes
from ..rules.request_defaults import TINY_DEFAULTS
from . import full_size
from .fake_cuda import PhaseBytes
from .flavors import GB, Flavor
from .rehearsal import PHASE_COMPONENT, PLANNED_VAE_DTYPE, Rehearsal, RehearsalOptions, rehearse

RESERVE = 3 * GB
HOST_RESERVE = 4 * GB


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
    attention_width: int = 7168  # heads × head dim: the rows' width context parallel exchanges
    element_bytes: int = 2  # one activation element in the compute dtype


# (options without the adapter, the adapter's identity, model) → (the adapter, its numbers): each request is
# rehearsed once while its entry lives; every placement and box is composed from those numbers (the adapter is kept
# so that its identity cannot be reused while its entry lives). Bounded: on a public Space every canvas and length a
# visitor tries is a new entry, and an unbounded map would keep them all for the life of the process.
MEASURED_ENTRIES = 32  # more than the plan, the docs tables and a session of the app ask for at once
_MEASURED: LRU[tuple[Any, int, str], tuple[Any, Measured]] = LRU(MEASURED_ENTRIES)


def measure(options: RehearsalOptions, model: str = full_size.FULL) -> Measured:
    """Rehearse ``options`` on ``model`` (``full`` or ``tiny``) with everything resident and keep the numbers; once
    per distinct request while it is among the :data:`MEASURED_ENTRIES` most recently asked (the same
    :class:`Measured` is returned again: treat it as read-only)."""
    key = (replace(options, adapter=None, offload="none"), id(options.adapter), model)
    return _MEASURED.get_or_compute(key, lambda: (options.adapter, _measure(options, model)))[1]


# The weights' sizes (fp8 storage, largest block, the conditioner's) depend on the model, partition, dtype and q/k/v
# fusion, never on the request: built from meta models once per such key (a second or two at full size).
_SIZES: LRU[tuple[Any, ...], tuple[int, int, int, int, int]] = LRU(8)


def _measure(options: RehearsalOptions, model: str) -> Measured:
    if model == full_size.FULL:
        rehearsal = rehearse(replace(options, offload="none"))
        config = full_size.transformer_config()
        conditioner_config, folder = None, full_size.location().folder
    elif model == repo.TINY:
        from transformers import Qwen3VLConfig

        from ..model.loader import _load_components

        small = replace(options, offload="none", size=options.size or TINY_DEFAULTS.planned_canvas)
        location = repo.locate(repo.TINY, options.workflow)
        rehearsal = rehearse(small, component_source=_load_components, pipeline_config=None, location=location)
        config = repo.read_transformer_config(repo.TINY, repo.partition_for(options.workflow))
        conditioner_config = Qwen3VLConfig.from_pretrained(str(location.folder / "text_encoder"))
        folder = location.folder
    else:
        raise H3AppError(f"plan --model {model!r}: use full (the published MiniMax-H3 sizes) or tiny.")
    partition = repo.partition_for(options.workflow)
    weights = dict(rehearsal.components)
    key = (model, str(folder), partition, options.dtype, options.fuse_qkv)
    fp8_bytes, block, whole, fp8_conditioner, conditioner_linear = _SIZES.get_or_compute(
        key, lambda: (*_transformer_sizes(config, options), *_text_encoder_sizes(conditioner_config, folder, options)))
    shapes = transformer_shapes(config)
    element = torch.empty((), dtype=options.dtype).element_size()
    largest = max(s.out_features * s.in_features for s in shapes.linears.values()) * element
    weights.setdefault(partition, 0)
    return Measured(rehearsal=rehearsal, weights=weights, fp8_transformer_bytes=fp8_bytes,
                    largest_linear_bytes=largest, block_bytes=block, lora_bytes=rehearsal.lora_bytes,
                    num_layers=shapes.num_layers, fp8_text_encoder_bytes=fp8_conditioner,
                    largest_text_encoder_linear_bytes=conditioner_linear, text_encoder_load_bytes=whole,
                    attention_width=shapes.heads * shapes.head_dim,
                    element_bytes=element)


def _text_encoder_sizes(config: Any, folder: Any, options: RehearsalOptions) -> tuple[int, int, int]:
    """(bytes of the whole conditioner as loaded, bytes of the cut one with fp8 decoder layers, bytes of its
    largest decoder Linear in the compute dtype), from meta models built as the loader builds them."""
    from ..model import conditioner
    from ..model.loader import LoadOptions

    load = LoadOptions(dtype=options.dtype)
    whole = full_size.build_meta("text_encoder", load, config)
    whole_bytes = full_size.parameter_bytes(whole)
    layers = conditioner.layers_read_from(str(folder))
    linears = [m for m in conditioner.decoder_layers(whole)[0].modules() if isinstance(m, torch.nn.Linear)]
    largest = max(m.weight.numel() for m in linears) * torch.empty((), dtype=options.dtype).element_size()
    with_fp8 = full_size.build_text_encoder(replace(load, fp8_text_encoder=True), layers, config)
    return whole_bytes, full_size.parameter_bytes(with_fp8), largest


def _transformer_sizes(config: dict[str, Any], options: RehearsalOptions) -> tuple[int, int]:
    """(bytes with diffusers' fp8 layerwise casting, bytes of the largest main block) from a meta model."""
    from ..model import fp8
    from ..model.loader import LoadOptions

    model = full_size.build_meta(MAIN_PARTITION, LoadOptions(dtype=options.dtype, fuse_qkv=options.fuse_qkv), config)
    block = max(full_size.parameter_bytes(b) for b in model.get_submodule("transformer_blocks").children())
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
    pristine = rehearsal.pristine_host_bytes if lora_mode == MERGED else 0
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


# Fastest first: everything resident beats moving weights over PCIe, and fp8's per-layer upcast costs less than
# offload's copies; the conditioner runs once per request, so its fp8 costs least of all.
PREFERENCE = tuple(Placement(offload, fp8=fp8, fp8_text_encoder=both)
                   for offload in OFFLOAD_MODES for fp8, both in ((False, False), (True, False), (True, True)))


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``bfloat16``: how ``--dtype`` and ``plan --json`` name it."""
    return str(dtype).removeprefix("torch.")


def run_options(placement: Placement, dtype: str, vae_dtype: str | None = None) -> str:
    """The flags that run ``placement`` on a GPU box, for app.py and every command alike: the device and ``dtype``
    the plan was made for, then the placement's own (offload needs ``--device cuda``), and ``--vae-dtype`` when the
    plan's video decoder (None: the planned default) is not what ``auto`` gives on ``--device cuda``."""
    planned = dtype_name(PLANNED_VAE_DTYPE)
    vae = f" --vae-dtype {vae_dtype}" if (vae_dtype or planned) != planned else ""
    return f"--device cuda --dtype {dtype} {placement.label}{vae}"
