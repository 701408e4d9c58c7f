"""The full-size rehearsal: h3app's own code paths on fake CUDA, at the real sizes, with the bytes they hold.

One rehearsal = what a GPU box does for one request: the loader builds and places the workflow's components
(``LoadedModel`` with the full-size ``component_source``; t2va/fl2va on ``transformer``, ref2va on
``transformer_ref``), the LoRA engine binds an adapter normalised from a header (fake factors) unmerged or merged,
the worker runs ``run_generation`` for one denoising step (2 sigma points) at the canvas — text encoder, keyframe
or reference encode, transformer, both VAE decodes —. The token counts are those the pipeline itself packs (read from the transformer's inputs).
With ``equivalence`` the worker runs the backend's equivalence check instead (``rehearsal_check.py``).
The FLOPs of the request are counted on the same run (``work.py``).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..adapters.types import HeaderView
from ..backend.generation import GenerationRequest, request_shift, run_generation
from ..backend.preview import PreviewBoard
from ..backend.worker import Worker
from ..errors import H3AppError
from ..lora.engine import LoRAEngine
from ..lora.layers import PristineStore
from ..model import diffusers_compat, repo
from ..model.compiled import blocks_of
from ..model.loader import LoadedModel, LoadOptions, config_of
from ..model.sub_block_cache import SubBlockCache
from ..rules.choices import FL2VA, T2VA, UNMERGED, VAE_AUTO, vae_dtype_for
from ..rules.frames import RELEASED
from ..rules.h3_modules import transformer_shapes
from ..settings import LoRASettings
from . import full_size
from .decode_split import DecodeCalls, decode_calls
from .fake_cuda import PhaseBytes, fake_cuda
from .header_adapter import adapter_from_header
from .rehearsal_check import CheckRehearsal, rehearse_check
from .replay import replay_calls
from .work import Flops, counting

# The component whose weights each phase of a request reads (the denoising steps read the transformer).
PHASE_COMPONENT = {"text_encoder": "text_encoder", "vae_encode": "vae", "vae_decode": "vae",
                   "audio_vae_encode": "audio_vae", "audio_vae_decode": "audio_vae"}

RESOLUTIONS: dict[str, tuple[int, int]] = {"544p": (544, 960), "768p": (768, 1344)}
PROMPT = "a paper boat drifting down a rain-filled street gutter, rain and distant thunder"
ADAPTER_NAME = "rehearsal"
ENCODERS = ("text_encoder",)
PREVIEW = "preview"  # the phase a step preview's work is counted under
# Sigma points the rehearsal runs: 2 = one denoising step, not a request default. The rehearsal measures one
# evaluation's bytes and FLOPs, and roofline.py scales them to a request's own steps: more would only cost time.
REHEARSAL_STEPS = 2


# What the video decoder computes in on a CUDA box when --vae-dtype is left at auto: the rehearsal's fake CUDA device
# and every box the plan judges (the plan is always for a GPU).
PLANNED_VAE_DTYPE: torch.dtype = getattr(torch, vae_dtype_for(VAE_AUTO, "cuda"))


@dataclass(frozen=True)
class RehearsalOptions:
    """One request on one configuration. ``adapter`` is a safetensors header (None: no LoRA)."""

    workflow: str = T2VA
    resolution: str = "544p"
    duration: float = RELEASED.shortest_seconds
    dtype: torch.dtype = torch.bfloat16
    offload: str = "none"
    fuse_qkv: bool = False
    adapter: HeaderView | None = None
    alpha: float | None = None
    scale: float = 1.0
    lora_mode: str = UNMERGED
    size: tuple[int, int] | None = None
    vae_dtype: torch.dtype = PLANNED_VAE_DTYPE  # what the video decoder's layers compute in (``--vae-dtype``)
    equivalence: bool = False  # run the backend's equivalence check (fallback, A, control, B) with ``adapter``
    preview: bool = False  # a step preview (backend.preview, waveform band included) after every evaluation

    @property
    def canvas(self) -> tuple[int, int]:
        """``(height, width)`` in pixels: ``size`` when given (a small model's canvas), else the resolution's."""
        return self.size or RESOLUTIONS[self.resolution]


@dataclass
class Rehearsal:
    """What ran and what it held. Bytes are device (GPU) bytes unless named host."""

    options: RehearsalOptions
    components: dict[str, int]
    host_components: dict[str, int]
    lora_bytes: int
    pristine_host_bytes: int
    phases: dict[str, PhaseBytes]
    device_peak: int
    host_peak: int
    tokens: dict[str, int]
    targets_bound: int
    evaluations: int
    video_shape: tuple[int, ...]
    audio_shape: tuple[int, ...]
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    check: CheckRehearsal | None = None  # what the equivalence check ran (``options.equivalence``)
    flops: Flops = field(default_factory=dict)  # phase → kind (base/lora) → precision → FLOPs (``work.py``)
    attention: Flops = field(default_factory=dict)  # the fused attention ops' share of ``flops``, same keys
    moved: dict[str, dict[str, int]] = field(default_factory=dict)  # phase → kind → bytes of memory-bound ops
    ops: dict[str, dict[str, int]] = field(default_factory=dict)  # phase → kind → ops that did work (kernel launches)
    scheduler_shift: float = 3.0  # the pipeline's default video shift (how many evaluations N steps run)
    preview_read_bytes: int = 0  # device bytes one step preview reads (``options.preview``; FLOPs: phase "preview")
    preview_decoder: str | None = None
    decode: DecodeCalls = field(default_factory=DecodeCalls)  # the video decode's decoder calls (``decode_split``)


def rehearse(options: RehearsalOptions, *,
             component_source: Callable[..., dict[str, Any]] = full_size.component_source,
             location: repo.ModelLocation | None = None,
             pipeline_config: dict[str, Any] | None = full_size.CANVAS_CONFIG) -> Rehearsal:
    """Run ``options`` on fake CUDA through h3app's loader, LoRA engine, worker and pipeline; count the bytes.
    ``pipeline_config``: canvas settings of the model rehearsed (None: the location's own)."""
    started = time.perf_counter()
    height, width = options.canvas
    load = LoadOptions(dtype=options.dtype, offload=options.offload, fuse_qkv=options.fuse_qkv,
                       vae_dtype=options.vae_dtype)
    object.__setattr__(load, "device", "cuda")  # the device exists on fake CUDA only: LoadOptions' check would refuse
    with tempfile.TemporaryDirectory(prefix="h3app-rehearsal-") as scratch, fake_cuda() as mode:
        counter = mode.counter
        # Decodes are never reused: a digest of fake latents is a digest of zeros, equal for every column.
        loaded = LoadedModel(location=location or full_size.location(), options=load,
                             component_source=component_source, decode_cache=SubBlockCache(max_entries=0, enabled=False))
        with counter.phase("load"):
            pipe = loaded.pipeline(options.workflow)
        if pipeline_config:
            pipe.register_to_config(**pipeline_config)
        components = {name: full_size.parameter_bytes(c) for name, c in loaded.components.items()
                      if isinstance(c, torch.nn.Module)}
        on_device = {name: size for name, size in components.items() if _device_of(loaded.components[name]) == "cuda"}
        transformer = loaded.transformer(options.workflow)

        engine, bound, lora_bytes, header = None, 0, 0, options.adapter
        if options.equivalence and header is None:
            raise H3AppError("the equivalence rehearsal needs an adapter: give its safetensors header as adapter=.")
        if header is not None and not options.equivalence:
            engine, bound, lora_bytes = _attach(transformer, header, options, counter)
        checked = header if options.equivalence else None  # the check's adapter (it binds it itself)
        pristine = engine.pristine.ram_bytes if engine is not None else 0  # the count we plan for

        request = GenerationRequest(prompt=PROMPT, steps=REHEARSAL_STEPS, duration=options.duration, height=height,
                                    width=width, workflow=options.workflow,
                                    **_workflow_files(options.workflow, Path(scratch), height, width))
        tokens: dict[str, int] = {}
        undo = _instrument(loaded, options.workflow, counter, tokens)
        worker = Worker(max_queue=1)

        counts: dict[str, Any] = {}  # the work counter's flops, attention, moved and ops, by phase
        board = PreviewBoard(audio=True) if options.preview else None

        def job(ctx) -> Any:
            with mode.on_this_thread(), counting(counter) as work:
                try:
                    if checked is not None:
                        return rehearse_check(loaded, checked, request, Path(scratch))
                    listeners = (_counted_preview(board.listener(pipe), counter),) if board is not None else ()
                    return run_generation(pipe, request, on_step=ctx.on_step, should_cancel=ctx.should_cancel,
                                          listeners=listeners)
                finally:
                    counts.update(flops=work.by_phase(), attention=work.attention_by_phase(),
                                  moved=work.moved_by_phase(), ops=work.ops_by_phase())

        try:
            result = worker.run(job, label="rehearsal")
        finally:
            worker.close()
            undo()
        if engine is not None:
            with counter.phase("detach"):
                engine.detach()
        check = result if options.equivalence else None
        latest = board.latest() if board else None
        if check is not None:
            bound, lora_bytes = check.targets_bound, check.lora_bytes
        return Rehearsal(
            options=options, components=on_device,
            host_components={n: s for n, s in components.items() if n not in on_device},
            lora_bytes=lora_bytes, pristine_host_bytes=pristine, phases=dict(counter.phases),
            device_peak=counter.device_peak, host_peak=counter.host_peak, tokens=tokens, targets_bound=bound,
            evaluations=check.evaluations if check else result.evaluations,
            video_shape=() if check else tuple(result.video.shape),
            audio_shape=() if check else tuple(result.audio.shape),
            seconds=time.perf_counter() - started, check=check, **counts,
            scheduler_shift=request_shift(pipe, request),
            preview_read_bytes=max((p.read_bytes for p in board.history()), default=0) if board else 0,
            preview_decoder=latest.decoder if latest else None,
            decode=decode_calls(loaded.components.get("vae"), tokens.get("latent_frames", 0), height, width))


def _counted_preview(listener: Any, counter) -> Any:
    """``listener`` with its preview work (``evaluated``) counted under the phase :data:`PREVIEW`."""
    evaluated = listener.evaluated

    def counted(*args: Any, **kwargs: Any) -> None:
        with counter.phase(PREVIEW):
            evaluated(*args, **kwargs)

    listener.evaluated = counted
    return listener


def _attach(transformer: torch.nn.Module, header: HeaderView, options: RehearsalOptions,
            counter) -> tuple[LoRAEngine, int, int]:
    """Bind ``header``'s adapter through the LoRA engine in ``options.lora_mode``; (engine, targets, the bytes of
    the factors as the engine keeps them).
    Host RAM for merged mode's pristine copies is the plan's question, so the store is told not to refuse."""
    shapes = transformer_shapes(config_of(transformer))
    partition = repo.partition_for(options.workflow)
    adapter = adapter_from_header(header, shapes, partition=partition)
    device = "cuda" if options.offload != "none" else None
    engine = LoRAEngine(transformer, pristine=PristineStore(prefer="ram", available_ram=lambda: None), device=device)
    settings = LoRASettings(source=adapter.identity, alpha=options.alpha, strength=options.scale,
                            mode=options.lora_mode)
    with counter.phase("attach"):
        report = engine.attach(adapter, settings, ADAPTER_NAME)
    return engine, len(report.matched), engine.factor_bytes


def _device_of(module: torch.nn.Module) -> str:
    for tensor in module.parameters():
        return tensor.device.type
    return "cpu"


def _workflow_files(workflow: str, folder: Path, height: int, width: int) -> dict[str, Any]:
    """Keyframe (fl2va) or reference image (ref2va) files at the canvas size."""
    if workflow == T2VA:
        return {}
    from PIL import Image

    path = folder / "keyframe.png"
    Image.new("RGB", (width, height), (90, 120, 160)).save(path)
    return {"first_frame": str(path)} if workflow == FL2VA else {"references": (str(path),)}


def _instrument(loaded: LoadedModel, workflow: str, counter, tokens: dict[str, int]) -> Callable[[], None]:
    """Phase marks around each component's work, and the transformer's packed row counts; returns the undo."""
    handles: list[Any] = []
    restore: list[tuple[Any, str]] = []

    def around(module: torch.nn.Module, name: str) -> None:
        handles.append(module.register_forward_pre_hook(lambda *_: counter.begin(name)))
        handles.append(module.register_forward_hook(lambda *_: counter.end(name)))

    def wrap(component: Any, method: str, name: str) -> None:
        original = getattr(component, method)

        def run(*args: Any, **kwargs: Any) -> Any:
            if PREVIEW in counter.open_phases:  # a step preview's own decode is the preview's work
                return original(*args, **kwargs)
            if name == "vae_decode":  # the latents' frames set how many clips the decode runs
                tokens["latent_frames"] = int(args[0].shape[2])
            with counter.phase(name):
                return original(*args, **kwargs)

        setattr(component, method, run)
        restore.append((component, method))

    transformer = loaded.transformer(workflow)

    def count(module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        tokens["video"] = int(kwargs["hidden_states"].shape[1])
        tokens["audio"] = int(kwargs["audio_hidden_states"].shape[1])
        tokens["text"] = int(kwargs["encoder_hidden_states"].shape[1])
        tokens["total"] = tokens["video"] + tokens["audio"] + tokens["text"]

    handles.append(transformer.register_forward_pre_hook(count, with_kwargs=True))
    around(transformer, "denoise")
    encoder = loaded.components.get("text_encoder")
    if encoder is not None:
        around(encoder.model if hasattr(encoder, "model") else encoder, "text_encoder")
    for name in ("vae", "audio_vae"):
        component = loaded.components.get(name)
        if component is not None:
            wrap(component, "decode", f"{name}_decode")
            wrap(component, "encode", f"{name}_encode")
    # Identical layers are run once per signature and replayed (replay.replay_calls): same bytes, far fewer ops.
    # The video VAE's clips (one shape each but the last), tiles and blocks; the audio decoder's repeated activations.
    repeated = [transformer, *[loaded.components[name] for name in (*ENCODERS, "vae", "audio_vae")
                               if name in loaded.components]]
    vae = loaded.components.get("vae")
    layers = [layer for component in repeated for layer in blocks_of(component, at_least=2)]
    if vae is not None:
        layers += [vae.encoder, vae.decoder]
    clips = diffusers_compat.per_clip_methods(vae) if vae is not None else []
    undo_replay = replay_calls([(layer, "forward") for layer in layers] + clips, counter)

    def undo() -> None:
        undo_replay()
        for handle in handles:
            handle.remove()
        for component, method in restore:
            delattr(component, method)

    return undo
