"""fp8 weight storage at run time: diffusers' layerwise casting, weights stored ``float8_e4m3fn`` and each layer
upcast to the compute dtype for its own forward (then dropped again).

One rule for the transformer (``--fp8``) and one for the conditioner (``--fp8-text-encoder``); the planner sizes
its placements with these very calls on meta modules, so the plan and the runtime store the same bytes.

- Transformer: ``ModelMixin.enable_layerwise_casting`` with diffusers' default skips (norms, patch/position
  embeddings, ``proj_in``/``proj_out``) and the model's fp32 islands.
- Conditioner: the Qwen3-VL decoder layers only (their Linears; norms stay). The embeddings and the vision tower
  keep the load dtype, so ``text_encoder.dtype`` (the first parameter, in the vision tower), which the pipeline
  casts pixels and prompt embeddings to, stays the compute dtype.

LoRA stays exact only unmerged: a merge would round into fp8, so merged mode is refused with ``--fp8``.
"""

from __future__ import annotations

import torch

from ..errors import H3AppError

STORAGE = torch.float8_e4m3fn


def store_transformer(transformer: torch.nn.Module, compute_dtype: torch.dtype) -> torch.nn.Module:
    """``transformer`` (a diffusers model) with fp8 storage and ``compute_dtype`` compute, in place."""
    from diffusers.models import ModelMixin

    if not isinstance(transformer, ModelMixin):
        raise H3AppError(f"--fp8 stores a diffusers model's weights; a {type(transformer).__name__} is not one.")
    transformer.enable_layerwise_casting(storage_dtype=STORAGE, compute_dtype=compute_dtype)
    return transformer


def store_text_encoder(text_encoder: torch.nn.Module, compute_dtype: torch.dtype) -> torch.nn.Module:
    """The Qwen3-VL conditioner's decoder layers with fp8 storage, in place."""
    from diffusers.hooks import apply_layerwise_casting

    from .conditioner import decoder_layers

    apply_layerwise_casting(decoder_layers(text_encoder), storage_dtype=STORAGE, compute_dtype=compute_dtype)
    return text_encoder


MERGED_REFUSAL = ("--fp8 stores the transformer in float8_e4m3fn and a merged LoRA would round into it: "
                  "use unmerged mode, or load without --fp8.")
