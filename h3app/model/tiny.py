"""The embedded tiny MiniMax H3 checkpoint: the real repo's folder layout at tiny dims, and the commands that make it.

    python -m h3app.model.tiny train [DIR]   # the committed, trained checkpoint and demo LoRAs (docs/demo.md)
    python -m h3app.model.tiny build DIR     # the untrained starting point (seeded random weights)

The result loads through the same loader as ``MiniMaxAI/MiniMax-H3`` (``modular_model_index.json`` plus one folder
per component, ``transformer_ref/`` included; docs/architecture.md, decision 9). The transformer is diffusers' own test
config (hidden 24, 2 heads × 16, 2 layers, 2 refiner layers, ffn 32, in_channels 4, text_dim 8); the audio VAE keeps
the real hop of 800 samples per latent at 32 kHz (so the soundtrack lasts as long as the video); the text encoder is a
real Qwen3-VL with 51 decoder layers at hidden size 8 (the pipeline reads ``hidden_states[50]``) and a byte-level
tokenizer, built locally, whose merges make the demo vocabulary's words single tokens.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from ..rules.choices import MAIN_PARTITION, REFERENCE_PARTITION, TINY_REPO_ID

SEED = 20261129

TINY_TRANSFORMER_CONFIG: dict[str, Any] = {
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "hidden_size": 24,
    "num_layers": 2,
    "num_refiner_layers": 2,
    "ffn_dim": 32,
    "in_channels": 4,
    "audio_in_channels": 8,
    "patch_size": (1, 2, 2),
    "text_dim": 8,
    "freq_dim": 8,
    "time_embed_hidden_dim": 24,
    "time_embed_dim": 16,
    "rope_freq_dim": 2,
}

TINY_VAE_CONFIG: dict[str, Any] = {
    "latent_channels": 4,
    "block_out_channels": (8, 16),
    "layers_per_block": 1,
    "spatial_downsample_factors": (2, 2),
    "temporal_downsample_factors": (2, 2),
    "norm_num_groups": 8,
    "decoder_num_layers": 2,
    "decoder_num_attention_heads": 2,
    "decoder_attention_head_dim": 8,
    "decoder_num_register_tokens": 2,
    "decoder_ffn_mult": 2,
    "clip_length": 17,
    "token_drop": 3,
    "latents_mean": [0.1, -0.1, 0.05, 0.0],
    "latents_std": [1.0, 0.9, 1.1, 1.0],
}

TINY_AUDIO_VAE_CONFIG: dict[str, Any] = {
    "encoder_dim": 4,
    "encoder_rates": (2, 4, 4, 5, 5),
    "latent_dim": 32,
    "latent_channels": 8,
    "num_attention_heads": 2,
    "decoder_dim": 128,
    "decoder_rates": (5, 5, 2, 2, 2, 2, 2),
    "decoder_kernel_sizes": (9, 9, 4, 4, 4, 4, 4),
    "resblock_kernel_sizes": (3,),
    "resblock_dilation_sizes": ((1,),),
    "sampling_rate": 32000,
    "latents_mean": [0.0] * 8,
    "latents_std": [1.0] * 8,
}

# The canvas the tiny model is trained at (32 × 56, 16:9): `generate --model tiny` without a size takes seconds.
TINY_CANVAS = {"canvas_short_edge": 32, "canvas_max_pixels": 64 * 96, "reference_image_short_edge": 32}

QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)


def _word_merges(words: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Left-to-right BPE merges that make each of ``words`` after a space one token (``Ġword``; Ġ is the byte-level
    space). Bare words get no merges, which would otherwise split the spaced ones."""
    merges: list[tuple[str, str]] = []
    for word in words:
        symbol = "\u0120" + word
        for end in range(2, len(symbol) + 1):
            pair = (symbol[: end - 1], symbol[end - 1])
            if pair[0] + pair[1] not in vocab:
                vocab[pair[0] + pair[1]] = len(vocab)
                merges.append(pair)
    return merges


def _build_tokenizer():
    """A byte-level BPE (the 256-symbol byte alphabet) whose merges make the demo vocabulary's words whole tokens,
    plus Qwen's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import Qwen2TokenizerFast

    from .tiny_training.scenes import VOCABULARY

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: index for index, symbol in enumerate(sorted(alphabet))}
    merges = _word_merges(list(VOCABULARY), vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    tokenizer = Qwen2TokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(QWEN_SPECIAL_TOKENS[1:]),
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN_SPECIAL_TOKENS[1:])})
    return tokenizer


def _build_text_encoder(tokenizer):
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_SPECIAL_TOKENS}
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 8,
            "intermediate_size": 16,
            "num_hidden_layers": 51,  # the pipeline reads hidden_states[50]
            "num_attention_heads": 1,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
                                "mrope_interleaved": True},
        },
        vision_config={
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": 8,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    model = Qwen3VLForConditionalGeneration(config).eval()
    # Random word embeddings passed straight through: every decoder layer's output projections are zero, so
    # hidden_states[50] is the token embedding and a word means the same vector wherever it stands.
    with torch.no_grad():
        model.model.language_model.embed_tokens.weight.normal_(0.0, 1.0)
        for layer in model.model.language_model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return model


def _build_processor(tokenizer):
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    image_processor = Qwen2VLImageProcessor(patch_size=16, merge_size=2, temporal_patch_size=2,
                                            min_pixels=32 * 32, max_pixels=256 * 256)
    video_processor = Qwen3VLVideoProcessor(patch_size=16, merge_size=2, temporal_patch_size=2,
                                            size={"shortest_edge": 32 * 32, "longest_edge": 256 * 256})
    return Qwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor)


def build_components() -> dict[str, Any]:
    """All tiny components, seeded (same seed → bitwise the same weights)."""
    import torch
    from diffusers import MiniMaxH3Scheduler

    # diffusers' top-level __init__ declares these classes for type checkers through its dummy objects
    # (torch-less stand-ins); diffusers.models names the real ones, the same classes at run time.
    from diffusers.models import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel

    torch.manual_seed(SEED)
    transformer = MiniMaxH3Transformer3DModel(**TINY_TRANSFORMER_CONFIG)
    torch.manual_seed(SEED + 1)
    transformer_ref = MiniMaxH3Transformer3DModel(**TINY_TRANSFORMER_CONFIG)
    torch.manual_seed(SEED + 2)
    vae = AutoencoderKLMiniMaxH3(**TINY_VAE_CONFIG)
    torch.manual_seed(SEED + 3)
    audio_vae = AutoencoderKLMiniMaxH3Audio(**TINY_AUDIO_VAE_CONFIG)
    tokenizer = _build_tokenizer()
    torch.manual_seed(SEED + 4)
    text_encoder = _build_text_encoder(tokenizer)
    processor = _build_processor(tokenizer)
    return {
        MAIN_PARTITION: transformer.eval(),
        REFERENCE_PARTITION: transformer_ref.eval(),
        "vae": vae.eval(),
        "audio_vae": audio_vae.eval(),
        "scheduler": MiniMaxH3Scheduler(shift=12.0),
        "audio_scheduler": MiniMaxH3Scheduler(shift=3.0),
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
        "processor": processor,
    }


def _rewrite_index(index_path: Path, repo_id: str) -> None:
    """``save_pretrained`` records the absolute output path in every component spec: point them at ``repo_id``."""
    index = json.loads(index_path.read_text())
    for name, value in index.items():
        if isinstance(value, list) and len(value) == 3 and isinstance(value[2], dict):
            spec = value[2]
            if "pretrained_model_name_or_path" in spec:
                spec["pretrained_model_name_or_path"] = repo_id
                spec["subfolder"] = name
    index.update(TINY_CANVAS)
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def save_checkpoint(components: dict[str, Any], out_dir: str | Path) -> Path:
    """Write ``components`` as a checkpoint folder in the real layout (replaced if it exists)."""
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import MiniMaxH3Blocks  # the real class

    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    pipe = MiniMaxH3Blocks().init_pipeline()
    pipe.update_components(**components)
    pipe.save_pretrained(str(out), overwrite_modular_index=True)
    _rewrite_index(out / "modular_model_index.json", TINY_REPO_ID)
    return out


def build(out_dir: str | Path) -> Path:
    """Write the *untrained* tiny checkpoint (seeded random weights, the training recipe's starting point)."""
    return save_checkpoint(build_components(), out_dir)


def checkpoint():
    """The recipe's view of this module: how to build and save the tiny checkpoint."""
    from .tiny_training.recipe import Checkpoint

    return Checkpoint(build=build_components, save=save_checkpoint)


def main(argv: list[str] | None = None) -> int:
    from .tiny_training.recipe import STAGES, Recipe, train

    parser = argparse.ArgumentParser(prog="python -m h3app.model.tiny")
    sub = parser.add_subparsers(dest="command", required=True)
    build_parser = sub.add_parser("build", help="write the tiny checkpoint to DIR")
    build_parser.add_argument("dir")
    train_parser = sub.add_parser("train", help="train the tiny checkpoint and the demo LoRAs (see docs/demo.md)")
    train_parser.add_argument("dir", nargs="?", default="assets/tiny-h3", help="checkpoint folder to write")
    train_parser.add_argument("--adapters", default="assets/adapters", help="folder for the two demo LoRAs")
    train_parser.add_argument("--work", default="build/tiny-train",
                              help="folder for per-stage results; a rerun resumes after the last finished stage")
    train_parser.add_argument("--smoke", action="store_true", help="one or two steps per stage (checks the recipe)")
    train_parser.add_argument("--only", choices=STAGES,
                              help="run just this stage into --work (to run independent stages side by side)")
    args = parser.parse_args(argv)
    if args.command == "train":
        recipe = Recipe.smoke() if args.smoke else Recipe()
        train(checkpoint(), Path(args.dir), Path(args.adapters), Path(args.work), recipe, only=args.only)
        if args.only is not None:
            print(f"stage {args.only} done in {args.work}")
            return 0
        out = Path(args.dir)
    else:
        out = build(args.dir)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
