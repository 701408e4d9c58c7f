"""The conditioner cut to the layers MiniMax-H3 reads: bitwise the same conditioning as the whole stack, no LM head,
the vision tower kept; too short a stack refused; the loader and the plan's full-size build both cut it."""

from __future__ import annotations

import copy

import pytest
import torch
from PIL import Image

from h3app.errors import H3AppError
from h3app.model import conditioner, repo

EXTRA_LAYERS = 6


def _pipeline():
    from diffusers import ModularPipeline

    return ModularPipeline.from_pretrained(str(repo.TINY_DIR))


def _deep_conditioner(layers: int):
    """A random tiny Qwen3-VL conditioner in the embedded checkpoint's config with ``layers`` decoder layers."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    config = Qwen3VLConfig.from_pretrained(str(repo.TINY_DIR / "text_encoder"))
    config.text_config.num_hidden_layers = layers
    torch.manual_seed(0)
    return Qwen3VLForConditionalGeneration(config).eval()


def _embeds(text_encoder, pipe, with_image: bool) -> torch.Tensor:
    """``hidden_states[text_encoder_layer]`` through diffusers' own encoder function, as the pipeline calls it."""
    from diffusers.modular_pipelines.minimax_h3.encoders import get_qwen3vl_prompt_embeds

    tokenizer, processor = pipe.tokenizer, pipe.processor
    token_ids = tokenizer("a red ball moving right over a grey floor", add_special_tokens=False)["input_ids"]
    vision = {}
    if with_image:
        image = Image.new("RGB", (64, 64), (200, 30, 30))
        vision = dict(processor.image_processor(images=[image], return_tensors="pt"))
        count = int(vision["image_grid_thw"][0].prod()) // processor.image_processor.merge_size ** 2
        token_ids = ([tokenizer.convert_tokens_to_ids("<|vision_start|>")]
                     + [tokenizer.convert_tokens_to_ids("<|image_pad|>")] * count
                     + [tokenizer.convert_tokens_to_ids("<|vision_end|>")] + token_ids)
    with torch.no_grad():
        return get_qwen3vl_prompt_embeds(text_encoder, processor, token_ids, vision,
                                         text_encoder_layer=pipe.text_encoder_layer, device="cpu",
                                         dtype=torch.float32)


@pytest.mark.parametrize("with_image", [False, True], ids=["text", "image"])
def test_trimmed_conditioning_is_bitwise_the_whole_stacks(with_image):
    pipe = _pipeline()
    needed = conditioner.layers_read(pipe)
    assert needed == pipe.text_encoder_layer + 1
    whole = _deep_conditioner(needed + EXTRA_LAYERS)
    pipe.load_components(names=["tokenizer", "processor"])
    cut = conditioner.trim(copy.deepcopy(whole), needed)
    assert len(conditioner.decoder(cut).layers) == needed and cut.config.text_config.num_hidden_layers == needed
    assert isinstance(cut.lm_head, torch.nn.Identity)
    assert sum(p.numel() for p in cut.model.visual.parameters()) == sum(p.numel() for p in whole.model.visual.parameters())
    expected, got = _embeds(whole, pipe, with_image), _embeds(cut, pipe, with_image)
    assert torch.equal(expected, got)


def test_a_stack_shorter_than_the_layer_read_is_refused_in_one_line():
    pipe = _pipeline()
    needed = conditioner.layers_read(pipe)
    short = _deep_conditioner(needed - 1)
    with pytest.raises(H3AppError, match=f"needs at least {needed}") as caught:
        conditioner.trim(short, needed)
    assert "\n" not in str(caught.value)


def test_the_loader_holds_the_cut_conditioner():
    from h3app.model.loader import load_model

    model = load_model("tiny")
    text_encoder = model.components["text_encoder"]
    assert len(conditioner.decoder(text_encoder).layers) == conditioner.layers_read(_pipeline())
    assert isinstance(text_encoder.lm_head, torch.nn.Identity)


def test_the_full_size_build_is_cut_to_51_layers_and_saves_the_head_and_13_layers():
    from h3app.hardware import full_size
    from h3app.model.loader import LoadOptions

    options = LoadOptions(dtype=torch.bfloat16)
    whole = full_size.build_meta("text_encoder", options)
    cut = full_size.build_text_encoder(options, layers=conditioner.layers_read(_pipeline()))
    assert len(conditioner.decoder(whole).layers) == 64 and len(conditioner.decoder(cut).layers) == 51
    saved = full_size.parameter_bytes(whole) - full_size.parameter_bytes(cut)
    layer = full_size.parameter_bytes(conditioner.decoder(whole).layers[0])
    head = 151936 * 5120 * 2
    assert saved == 13 * layer + head
    assert 13e9 < saved < 15e9
