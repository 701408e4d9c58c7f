"""The full-size MiniMax-H3 components, built without weights: configs kept in the project, modules on ``meta``.

``--model full`` means these configs: the transformer (``rules.h3_modules.FULL_SIZE_CONFIG``, 33.1 B parameters),
diffusers' default ``AutoencoderKLMiniMaxH3`` and ``AutoencoderKLMiniMaxH3Audio`` (the released VAEs), and a
Qwen3-VL-32B conditioner (64 layers, hidden 5120), cut as the loader cuts it (``model/conditioner.py``: the 51
layers the pipeline reads, no LM head) and stored fp8 when the options say so. Tokenizer, processor and schedulers have no size; they come
from the embedded tiny checkpoint (its token ids are written into the conditioner's config so that vision tokens
line up). :func:`component_source` plugs into ``LoadedModel.component_source``: the loader then places these
modules exactly as it places downloaded ones (``.to(device)``, offload), which under fake CUDA allocates fake
tensors of the real sizes.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Union

import torch

from ..lru import LRU
from ..model import conditioner, fp8, repo
from ..model.diffusers_compat import fp32_modules
from ..model.loader import LoadOptions, _load_components, decoder_dtype, fuse_qkv, prepare_text_encoder
from ..rules.choices import PARTITIONS
from ..rules.h3_modules import FULL_SIZE_CONFIG
from ..rules.request_defaults import FULL_DEFAULTS

if TYPE_CHECKING:
    from transformers import Qwen3VLConfig

FULL = "full"
# What a component is built from: a diffusers model's keyword arguments, or the conditioner's transformers config.
ComponentConfig = Union[Mapping[str, Any], "Qwen3VLConfig"]
SIZED = (*PARTITIONS, "vae", "audio_vae", "text_encoder")

# The released pipeline's canvas settings (the embedded index holds the tiny checkpoint's small ones).
CANVAS_CONFIG: dict[str, Any] = {"canvas_short_edge": min(FULL_DEFAULTS.planned_canvas),
                                 "canvas_max_pixels": FULL_DEFAULTS.max_pixels, "reference_image_short_edge": 2048}
AUDIO_VAE_CONFIG: dict[str, Any] = {"latents_mean": [0.0] * 32, "latents_std": [1.0] * 32}

# Qwen3-VL-32B: the conditioner MiniMax-H3 reads at layer 50 (62.1 GB in bf16).
TEXT_ENCODER_TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                              "mrope_section": [24, 20, 20], "mrope_interleaved": True},
}
TEXT_ENCODER_VISION_CONFIG: dict[str, Any] = {
    "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "out_hidden_size": 5120,
    "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [8, 16, 24],
}


def transformer_config() -> dict[str, Any]:
    return dict(FULL_SIZE_CONFIG)


def location() -> repo.ModelLocation:
    """Where the size-less parts (tokenizer, processor, schedulers, pipeline index) are read from."""
    return repo.ModelLocation(name=FULL, folder=repo.TINY_DIR)


def text_encoder_config() -> Qwen3VLConfig:
    """The Qwen3-VL-32B config, with the embedded tokenizer's special token ids."""
    from transformers import Qwen3VLConfig

    tiny = json.loads((repo.TINY_DIR / "text_encoder" / "config.json").read_text())
    ids = {k: v for k, v in tiny.items() if k.endswith("token_id")}
    return Qwen3VLConfig(text_config=dict(TEXT_ENCODER_TEXT_CONFIG), vision_config=dict(TEXT_ENCODER_VISION_CONFIG),
                         tie_word_embeddings=False, **ids)


# The released sizes' meta modules, built once per (component, dtypes, q/k/v fusion) and copied for each caller: the
# loader changes what it is given (``.to(device)``, fp8 storage), so nobody gets the kept one. A copy costs a few
# tenths of a second at full size; building costs up to ten times more (the audio VAE's anti-aliasing filters and
# weight norms run through torch's Python reference kernels on meta: ~3 s on 2 cores, in every rehearsal).
_BUILT: LRU[tuple[Any, ...], torch.nn.Module] = LRU(8)


def build_meta(name: str, options: LoadOptions, config: ComponentConfig | None = None) -> torch.nn.Module:
    """Component ``name`` at full size (or ``config``) on the meta device, in the dtypes ``from_pretrained`` gives:
    transformer and conditioner in ``options.dtype`` with diffusers' fp32 islands, the video VAE in
    ``loader.decoder_dtype(options)`` with its fp32 islands, the audio VAE fp32. A new module on each call (the released
    sizes' are copies of one built once, :data:`_BUILT`)."""
    from ..model.torch_compat import unset_fake_temporarily

    if config is not None:
        return _build(name, options, config)
    kept = _BUILT.get_or_compute((name, options.dtype, decoder_dtype(options), options.fuse_qkv),
                                 lambda: _build(name, options, None))
    with unset_fake_temporarily():  # meta copies, also when called under fake CUDA
        return copy.deepcopy(kept)


def _build(name: str, options: LoadOptions, config: ComponentConfig | None) -> torch.nn.Module:
    from ..model.torch_compat import unset_fake_temporarily

    # no_grad: weight norm's computed weights are then plain tensors, which a module copy can copy (a forward
    # pre-hook recomputes them before each use either way)
    # diffusers.models names diffusers' real classes (its top-level __init__ shows type checkers torch-less dummies)
    module: torch.nn.Module
    with unset_fake_temporarily(), torch.device("meta"), torch.no_grad():  # real meta modules, also under fake CUDA
        if name in PARTITIONS:
            from diffusers.models import MiniMaxH3Transformer3DModel

            transformer = MiniMaxH3Transformer3DModel(**_keywords(config, transformer_config()))
            to_dtype_keeping_islands(transformer, options.dtype)
            if options.fuse_qkv:
                fuse_qkv(transformer)
            module = transformer
        elif name == "vae":
            from diffusers.models import AutoencoderKLMiniMaxH3

            module = AutoencoderKLMiniMaxH3(**_keywords(config, {}))
            to_dtype_keeping_islands(module, decoder_dtype(options))  # from_pretrained's fp32 islands (encoder, norms)
        elif name == "audio_vae":
            from diffusers.models import AutoencoderKLMiniMaxH3Audio

            module = AutoencoderKLMiniMaxH3Audio(**_keywords(config, AUDIO_VAE_CONFIG))
        elif name == "text_encoder":
            from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

            if config is not None and not isinstance(config, Qwen3VLConfig):
                raise ValueError(f"the conditioner is built from a Qwen3VLConfig, not a {type(config).__name__}")
            built = Qwen3VLForConditionalGeneration(config or text_encoder_config())
            # transformers wraps PreTrainedModel.to in a decorator whose types take the model for the dtype
            module = built.to(options.dtype)  # type: ignore[arg-type]
        else:
            raise ValueError(f"{name} has no size")
    return module.requires_grad_(False).eval()


def _keywords(config: ComponentConfig | None, default: Mapping[str, Any]) -> dict[str, Any]:
    """A diffusers component's constructor arguments: ``config`` (a mapping), or ``default`` when it is empty."""
    if config is not None and not isinstance(config, Mapping):
        raise ValueError(f"a diffusers component is built from a mapping, not a {type(config).__name__}")
    return dict(config or default)


def to_dtype_keeping_islands(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """``module`` in ``dtype`` except what ``from_pretrained`` keeps: every parameter and buffer with one of the
    ``_keep_in_fp32_modules`` names as a component of its path in fp32 (diffusers' rule: ``norm1`` anywhere,
    ``scale1``), and the buffers no checkpoint holds (non-persistent: RoPE's ``inv_freq``) in the dtype they were
    built in."""
    saved = set(module.state_dict())
    built = {path: tensor.dtype for path, tensor in module.named_buffers() if path not in saved}
    module.to(dtype)
    if dtype == torch.float32 and not built:
        return
    keep = set(fp32_modules(module))
    named = [*module.named_parameters(), *module.named_buffers()]
    for path, tensor in named:
        if path in built and tensor.dtype != built[path]:
            owner, _, key = path.rpartition(".")
            setattr(module.get_submodule(owner) if owner else module, key, tensor.to(built[path]))
        elif tensor.is_floating_point() and keep & set(path.split(".")):
            owner, _, key = path.rpartition(".")
            child = module.get_submodule(owner) if owner else module
            value = tensor.to(torch.float32)  # setattr keeps a buffer a buffer (persistent or not)
            setattr(child, key, torch.nn.Parameter(value, requires_grad=False)
                    if isinstance(tensor, torch.nn.Parameter) else value)


def build_text_encoder(options: LoadOptions, layers: int, config: Qwen3VLConfig | None = None) -> torch.nn.Module:
    """The full-size (or ``config``) conditioner on meta as the loader holds it (``loader.prepare_text_encoder``)."""
    from ..model.torch_compat import unset_fake_temporarily

    with unset_fake_temporarily():
        return prepare_text_encoder(build_meta("text_encoder", options, config), layers, options)


def build_sized(name: str, loc: repo.ModelLocation, options: LoadOptions) -> torch.nn.Module:
    """Component ``name`` at full size, prepared as the loader prepares it (conditioner cut; fp8 storage)."""
    if name == "text_encoder":
        return build_text_encoder(options, conditioner.layers_read_from(str(loc.folder)))
    module = build_meta(name, options)
    if name in PARTITIONS and options.fp8:
        from ..model.torch_compat import unset_fake_temporarily

        with unset_fake_temporarily():
            fp8.store_transformer(module, options.dtype)
    return module


def component_source(loc: repo.ModelLocation, names: list[str], options: LoadOptions) -> dict[str, Any]:
    """``LoadedModel.component_source`` for the full-size model: sized parts on meta, the rest from ``loc``."""
    sized = {name: build_sized(name, loc, options) for name in names if name in SIZED}
    rest = [name for name in names if name not in SIZED]
    return {**sized, **(_load_components(loc, rest, options) if rest else {})}


def parameter_bytes(module: torch.nn.Module) -> int:
    """Bytes of ``module``'s parameters and persistent buffers (works on meta and fake tensors)."""
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())
