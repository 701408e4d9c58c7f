"""Only the conditioner layers MiniMax-H3 reads: the Qwen3-VL decoder stack up to the pipeline's layer, no LM head.

diffusers' ``get_qwen3vl_prompt_embeds`` runs ``text_encoder.model`` (never the LM head) and returns
``hidden_states[text_encoder_layer]``: the output of decoder layer ``text_encoder_layer`` (hidden_states[0] is the
embeddings). A causal decoder's layer-k output does not depend on later layers, so a stack cut to
``text_encoder_layer + 1`` layers gives the same conditioning bit for bit; exactly ``text_encoder_layer`` layers
would not (the last entry of ``hidden_states`` is the post-norm output, and diffusers refuses such a stack). The
vision tower stays whole (its deepstack features enter the first decoder layers).

What is downloaded is unchanged (whole shards); the dropped layers are freed right after loading.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import H3AppError


def layers_read(pipeline: Any) -> int:
    """Decoder layers the pipeline's text-encoder step needs: its ``text_encoder_layer`` + 1."""
    return int(pipeline.text_encoder_layer) + 1


def layers_read_from(folder: str) -> int:
    """:func:`layers_read` of the pipeline whose index lies in ``folder``."""
    from diffusers import ModularPipeline

    return layers_read(ModularPipeline.from_pretrained(str(folder)))


def decoder(text_encoder: torch.nn.Module) -> torch.nn.Module:
    """The Qwen3-VL text decoder (``text_encoder.model.language_model``)."""
    return text_encoder.get_submodule("model.language_model")


def decoder_layers(text_encoder: torch.nn.Module) -> torch.nn.ModuleList:
    """The Qwen3-VL text decoder's layers (``decoder(text_encoder).layers``)."""
    layers = decoder(text_encoder).get_submodule("layers")
    if not isinstance(layers, torch.nn.ModuleList):
        raise H3AppError(f"the text encoder's decoder layers are a {type(layers).__name__}, not a ModuleList: "
                         "use the released Qwen3-VL conditioner.")
    return layers


def trim(text_encoder: torch.nn.Module, layers: int) -> torch.nn.Module:
    """Keep the first ``layers`` decoder layers and drop the LM head, in place (config updated to match).

    A stack with fewer layers than ``layers`` is refused in one line: it cannot give MiniMax-H3's conditioning."""
    from transformers import PreTrainedModel

    if not isinstance(text_encoder, PreTrainedModel):
        raise H3AppError(f"the text encoder is a {type(text_encoder).__name__}, not a transformers model: "
                         "use the released Qwen3-VL conditioner.")
    stack = decoder(text_encoder)
    have = len(decoder_layers(text_encoder))
    if have < layers:
        raise H3AppError(f"the text encoder has {have} decoder layers; MiniMax-H3 reads the output of layer "
                         f"{layers - 1}, which needs at least {layers}: use the released Qwen3-VL conditioner.")
    config = text_encoder.config.text_config
    if have > layers:
        stack.layers = decoder_layers(text_encoder)[:layers]
        config.num_hidden_layers = layers
        if getattr(config, "layer_types", None):
            config.layer_types = list(config.layer_types)[:layers]
    if not isinstance(getattr(text_encoder, "lm_head", None), torch.nn.Identity):
        text_encoder.lm_head = torch.nn.Identity()  # never called by the pipeline; its weights are freed
    return text_encoder
