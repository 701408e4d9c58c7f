"""Load MiniMax H3 with diffusers: the same code for ``tiny``, a local folder and ``MiniMaxAI/MiniMax-H3``.

Components are loaded once and shared by the per-workflow pipelines (``t2va``/``fl2va`` on ``transformer``,
``ref2va`` on ``transformer_ref``); a partition is loaded only when a workflow first needs it.
"""

from __future__ import annotations

import os

# cuBLAS reads this once, when its handle is created on the first GEMM of a device: it must be in the environment
# before anything runs on CUDA, or the equivalence check's deterministic mode cannot take effect. Every path to a
# CUDA device goes through this module first. A user-set value wins.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import threading  # noqa: E402
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch  # noqa: E402

from ..errors import H3AppError
from ..rules import values
from ..rules.attention import AUTO, AttentionBackend
from ..rules.choices import (
    MAIN_PARTITION,
    OFFLOAD_MODES,
    PARTITIONS,
    REF2VA,
    REFERENCE_PARTITION,
    T2VA,
    VAE_AUTO,
    vae_dtype_for,
)
from ..rules.h3_modules import QKV
from . import attention as model_attention
from . import conditioner, diffusers_compat, fp8, repo, torch_compat
from .sub_block_cache import DECODE_STEPS, TEXT_ENCODER_STEP, SubBlockCache, with_sub_block_caches

if TYPE_CHECKING:  # diffusers.models names the real class (diffusers' top-level __init__ shows mypy a torch-less dummy)
    from diffusers.models import MiniMaxH3Transformer3DModel

# The doors to diffusers' and torch's private API, imported at start-up (every path to a model comes here): each
# refuses, in one line, a library version it was not written for, before anything is loaded.
PRIVATE_API_DOORS = (diffusers_compat, torch_compat)


@dataclass(frozen=True)
class LoadOptions:
    """How to place the model.

    ``dtype`` applies to the transformer and text encoder (diffusers keeps its fp32 islands and both VAEs in fp32).
    ``offload``: ``none`` (all on ``device``), ``auto`` (diffusers ``ComponentsManager`` auto CPU offload), ``group``
    (block-level group offload of the transformer). ``fp8`` stores the transformer's weights in ``float8_e4m3fn``
    and ``fp8_text_encoder`` the conditioner's decoder layers (``model/fp8.py``: compute stays ``dtype``; LoRA is then
    unmerged-only). ``fuse_qkv`` fuses q/k/v into ``attn.to_qkv`` at load time, before any adapter, and frees the
    split weights. The conditioner is always cut to the layers the pipeline reads (``model/conditioner.py``).
    ``compile`` runs the transformer's blocks through ``torch.compile`` (``h3app.model.compiled``). ``vae_dtype``:
    what the video decoder's layers compute in (``--vae-dtype``; diffusers keeps the video VAE's encoder and norms
    and the whole audio VAE in fp32 whatever it is): a torch dtype, or ``--vae-dtype``'s value (``auto``, the
    default: bf16 on a CUDA device, fp32 elsewhere); :func:`decoder_dtype` resolves it for ``device`` wherever it
    is read (``rules.choices.vae_dtype_for``). ``attention``: the
    ``--attention`` value (``rules.attention``; ``auto`` picks for the GPU, SDPA on a CPU); ``split``: how ranks
    split the sequence (``ulysses``, ``ring``, or "" for one rank), which limits the backends that can run.
    """

    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    offload: str = "none"
    fp8: bool = False
    fp8_text_encoder: bool = False
    fuse_qkv: bool = False
    revision: str | None = None
    token: str | None = None
    compile: bool = False
    vae_dtype: torch.dtype | str = VAE_AUTO
    attention: str = AUTO
    split: str = ""

    def __post_init__(self) -> None:
        check_device(self.device)
        decoder_dtype(self)  # an unknown --vae-dtype: one line before anything loads
        if self.attention != AUTO:  # a named backend that cannot run here: one line before anything loads
            model_attention.chosen(self.device, self.dtype, self.attention, self.split)
        if self.offload not in OFFLOAD_MODES:
            raise H3AppError(f"offload must be one of {', '.join(OFFLOAD_MODES)}, got {self.offload!r}.")
        if self.offload != "none" and not str(self.device).startswith("cuda"):
            raise H3AppError(f"--offload {self.offload} moves weights between host and GPU: it needs --device cuda "
                             f"(on {self.device} use --offload none).")


def decoder_dtype(options: Any) -> torch.dtype:
    """What the video decoder of a model placed by ``options`` (``LoadOptions``, or anything with ``vae_dtype`` and
    ``device``) computes in: its ``vae_dtype`` when a torch dtype, else that name resolved for its device
    (``auto``: bf16 on CUDA, fp32 elsewhere)."""
    asked = options.vae_dtype
    if isinstance(asked, torch.dtype):
        return asked
    return getattr(torch, vae_dtype_for(str(asked), str(options.device)))  # type: ignore[no-any-return]


def check_device(name: str) -> str:
    """``cpu``, ``cuda``, ``cuda:N``, ``mps``…: refused in one line when this machine does not have it (torch would
    fail later, mid-load, with a driver traceback)."""
    try:
        device = torch.device(str(name))
    except (RuntimeError, ValueError):
        raise H3AppError(f"unknown device {name!r}: use cpu, cuda or cuda:N.") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise H3AppError(f"--device {name}: this machine has no usable CUDA GPU (no driver, or none visible): "
                             f"use --device cpu.")
        if device.index is not None and device.index >= count:
            raise H3AppError(f"--device {name}: this machine has {count} CUDA GPU(s), numbered from 0: use "
                             f"cuda:0{f' to cuda:{count - 1}' if count > 1 else ''}.")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise H3AppError(f"--device {name}: Apple's MPS backend is not available here: use --device cpu.")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise H3AppError(f"--device {name}: h3app runs on cpu, cuda or mps.")
    return str(name)


def cuda_devices() -> list[tuple[str, int]]:
    """``(name, total bytes)`` of every CUDA device this process sees (empty without a driver or a GPU)."""
    if not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        devices.append((properties.name, int(properties.total_memory)))
    return devices


def parse_dtype(name: str) -> torch.dtype:
    """``float32``/``fp32``/``bfloat16``/``bf16`` (any case) → the torch dtype."""
    return getattr(torch, values.parse_dtype_name(name))


def config_of(model: torch.nn.Module) -> dict[str, Any]:
    """A diffusers model's config (``ConfigMixin.config``: the H3 transformer's shapes) as a plain dict."""
    from diffusers.configuration_utils import ConfigMixin

    if not isinstance(model, ConfigMixin):
        raise H3AppError(f"{type(model).__name__} is not a diffusers model: it has no config to read its shapes from.")
    return dict(model.config)


def fuse_qkv(transformer: MiniMaxH3Transformer3DModel) -> None:
    """Fuse every attention's q/k/v into a blocked ``[q; k; v]`` ``to_qkv`` and free the split weights.

    The fused processor reads only ``to_qkv``; keeping ``to_q/k/v`` would cost ~12 GB at full size.
    """
    transformer.fuse_qkv_projections()
    for module in transformer.modules():
        if getattr(module, "fused_projections", False) and hasattr(module, "to_qkv"):
            for name in QKV:
                if hasattr(module, name):
                    delattr(module, name)


def _load_transformer_from(folder: str, partition: str, options: LoadOptions) -> torch.nn.Module:
    from diffusers.models import MiniMaxH3Transformer3DModel

    transformer = MiniMaxH3Transformer3DModel.from_pretrained(folder, subfolder=partition, dtype=options.dtype)
    transformer.requires_grad_(False).eval()
    if options.fuse_qkv:
        fuse_qkv(transformer)
    if options.fp8:
        fp8.store_transformer(transformer, options.dtype)
    model_attention.apply(transformer, attention_of(options))
    if options.compile:
        from .compiled import compile_blocks

        compile_blocks(transformer, options.device)
    return transformer


def attention_of(options: LoadOptions) -> AttentionBackend:
    """The attention backend a transformer placed by ``options`` runs (``rules.attention.choose``)."""
    return model_attention.chosen(options.device, options.dtype, options.attention, options.split)


def prepare_text_encoder(text_encoder: torch.nn.Module, layers: int, options: LoadOptions) -> torch.nn.Module:
    """The conditioner as every path holds it: cut to ``layers`` decoder layers (no LM head), fp8 if asked."""
    conditioner.trim(text_encoder, layers)
    if options.fp8_text_encoder:
        fp8.store_text_encoder(text_encoder, options.dtype)
    return text_encoder


def load_transformer(model: str = repo.TINY, *, dtype: torch.dtype = torch.float32, fuse_qkv: bool = False,
                     partition: str = MAIN_PARTITION, revision: str | None = None,
                     fp8: bool = False, device: str = "cpu", attention: str = AUTO,
                     split: str = "") -> torch.nn.Module:
    """Only the transformer partition of ``model`` (for ``check --mode transformer`` and the LoRA engine), on the
    CPU; ``device``, ``attention`` and ``split``: where the caller will run it, which chooses its attention."""
    workflow = REF2VA if partition == REFERENCE_PARTITION else T2VA
    location = repo.locate(model, workflow=workflow, revision=revision)
    options = LoadOptions(dtype=dtype, fuse_qkv=fuse_qkv, revision=revision, fp8=fp8, device=device,
                          attention=attention, split=split)
    return _load_transformer_from(str(location.folder), partition, options)


@dataclass
class LoadedModel:
    """A model's loaded components, shared by the workflow pipelines built from them.

    Every workflow pipeline encodes prompts through ``prompt_cache`` (an LRU of text-encoder outputs) and decodes
    through ``decode_cache`` (off unless a comparison turns it on: equal latents are decoded once).

    Not thread-safe by design beyond component loading: one worker owns it (docs/architecture.md, decision 7).
    """

    location: repo.ModelLocation
    options: LoadOptions
    components: dict[str, Any] = field(default_factory=dict)
    _pipelines: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _manager: Any = None
    prompt_cache: SubBlockCache = field(default_factory=lambda: SubBlockCache(max_entries=32))
    decode_cache: SubBlockCache = field(default_factory=lambda: SubBlockCache(max_entries=2, enabled=False))
    # (location, names, options) → components; the hardware rehearsal builds full-size fake ones instead.
    component_source: Callable[[repo.ModelLocation, list[str], LoadOptions], dict[str, Any]] | None = None

    @property
    def name(self) -> str:
        return self.location.name

    @property
    def attention(self) -> AttentionBackend:
        """The attention backend its transformers run (chosen from its options at load)."""
        return attention_of(self.options)

    def transformer(self, workflow: str = T2VA) -> torch.nn.Module:
        """The transformer partition that ``workflow`` runs on (loaded on first use)."""
        self._ensure(workflow)
        return self.components[repo.partition_for(workflow)]

    def pipeline(self, workflow: str = T2VA):
        """A ``MiniMaxH3ModularPipeline`` pruned to ``workflow``, sharing this model's components."""
        repo.check_workflow(workflow)
        self._ensure(workflow)
        with self._lock:
            if workflow not in self._pipelines:
                from diffusers import ModularPipeline

                folder = str(self.location.folder)
                blocks = ModularPipeline.from_pretrained(folder, workflow=workflow).blocks  # pruned copy
                caches = {TEXT_ENCODER_STEP: self.prompt_cache, **{step: self.decode_cache for step in DECODE_STEPS}}
                pipe = with_sub_block_caches(blocks, caches).init_pipeline(folder)
                needed = repo.components_for(workflow)
                pipe.update_components(**{name: self.components[name] for name in needed})
                pipe.set_progress_bar_config(disable=True)  # progress is reported per step by the caller
                self._pipelines[workflow] = pipe
            return self._pipelines[workflow]

    def _ensure(self, workflow: str) -> None:
        with self._lock:
            missing = [name for name in repo.components_for(workflow) if name not in self.components]
            if not missing:
                return
            if self.location.repo_id is not None and repo.partition_for(workflow) in missing:
                # A Hub model downloads only what the first workflow needed; fetch the other partition now.
                self.location = repo.locate(self.location.repo_id, workflow=workflow,
                                            revision=self.options.revision, token=self.options.token)
            source = self.component_source or _load_components
            if self.options.offload == "none":  # one at a time: host RAM holds one component on its way to the GPU
                for name in missing:
                    self.components.update(source(self.location, [name], self.options))
                    self._place([name])
            else:
                self.components.update(source(self.location, missing, self.options))
                self._place(missing)

    def _place(self, names: list[str]) -> None:
        if self.options.offload == "none":
            for name in names:
                component = self.components[name]
                if isinstance(component, torch.nn.Module):
                    component.to(self.options.device)
            return
        from diffusers import ComponentsManager

        if self._manager is None:
            self._manager = ComponentsManager()
        for name in names:
            component = self.components[name]
            if isinstance(component, torch.nn.Module):
                self._manager.add(name, component)
        if self.options.offload == "group":
            for name in names:
                if name in PARTITIONS:
                    self.components[name].enable_group_offload(
                        onload_device=torch.device(self.options.device), offload_device=torch.device("cpu"),
                        offload_type="block_level", num_blocks_per_group=1, use_stream=True,
                    )
        self._manager.enable_auto_cpu_offload(device=self.options.device)


def _load_components(location: repo.ModelLocation, names: list[str], options: LoadOptions) -> dict[str, Any]:
    from diffusers import ModularPipeline

    folder = str(location.folder)
    loaded: dict[str, Any] = {}
    other = [name for name in names if name not in PARTITIONS]
    if other:
        pipe = ModularPipeline.from_pretrained(folder)
        dtypes = {"text_encoder": options.dtype, "vae": decoder_dtype(options), "default": torch.float32}
        try:
            pipe.load_components(names=other, dtype=dtypes)
        except (OSError, ValueError) as error:
            raise H3AppError(f"could not load {', '.join(other)} from {location.name}: {error}") from error
        for name in other:
            component = getattr(pipe, name, None)
            if component is None:
                raise H3AppError(f"{location.name}: component {name!r} did not load; is the folder complete?")
            if isinstance(component, torch.nn.Module):
                component.requires_grad_(False).eval()
            if name == "text_encoder":
                component = prepare_text_encoder(component, conditioner.layers_read(pipe), options)
            loaded[name] = component
    for partition in PARTITIONS:
        if partition in names:
            loaded[partition] = _load_transformer_from(folder, partition, options)
    return loaded


def load_model(model: str = repo.TINY, workflow: str = T2VA, options: LoadOptions | None = None) -> LoadedModel:
    """Resolve ``model`` and load what ``workflow`` needs."""
    options = options or LoadOptions()
    location = repo.locate(model, workflow=workflow, revision=options.revision, token=options.token)
    loaded = LoadedModel(location=location, options=options)
    loaded._ensure(workflow)
    return loaded
