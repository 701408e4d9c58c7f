"""The LoRA-able Linear layers of `MiniMaxH3Transformer3DModel`, computed from its config alone.

No torch needed: adapters are inspected and shape-checked against a model without loading it. The names are
the canonical targets of h3app — diffusers module names of the *unfused* transformer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Module groups, used for per-group strengths and the strength profile.
ATTENTION = "attention"
FEED_FORWARD = "feed_forward"
ADALN = "adaln"
REFINER = "refiner"
INPUT_OUTPUT = "input_output"
GROUPS = (ATTENTION, FEED_FORWARD, ADALN, REFINER, INPUT_OUTPUT)

# diffusers' constructor defaults: the published MiniMaxAI/MiniMax-H3 transformer config.
FULL_SIZE_CONFIG: dict[str, Any] = {
    "num_attention_heads": 56,
    "attention_head_dim": 128,
    "hidden_size": 5376,
    "num_layers": 50,
    "num_refiner_layers": 2,
    "ffn_dim": 14336,
    "in_channels": 24,
    "audio_in_channels": 32,
    "patch_size": [1, 2, 2],
    "text_dim": 5120,
    "freq_dim": 256,
    "time_embed_hidden_dim": 5376,
    "time_embed_dim": 2688,
    "rope_freq_dim": 16,
}

# The six Linears of every main and refiner block, relative to the block: what LightX2V's Turbo adapters target.
BLOCK_LINEARS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")
QKV = ("to_q", "to_k", "to_v")


@dataclass(frozen=True)
class LinearShape:
    """One Linear layer: weight is ``[out_features, in_features]``."""

    name: str
    out_features: int
    in_features: int
    group: str


@dataclass(frozen=True)
class TransformerShapes:
    """Every LoRA-able Linear of an H3 transformer, keyed by canonical (unfused diffusers) module name."""

    linears: Mapping[str, LinearShape]
    num_layers: int
    num_refiner_layers: int
    heads: int
    head_dim: int
    hidden_size: int

    def __contains__(self, name: str) -> bool:
        return name in self.linears

    def __getitem__(self, name: str) -> LinearShape:
        return self.linears[name]

    def __len__(self) -> int:
        return len(self.linears)

    @property
    def is_full_size(self) -> bool:
        return self.hidden_size == FULL_SIZE_CONFIG["hidden_size"] and self.num_layers == FULL_SIZE_CONFIG["num_layers"]


def group_of(name: str) -> str:
    """The group of a canonical target name (attention, feed_forward, adaln, refiner, input_output)."""
    if name.startswith("token_refiner."):
        return REFINER
    if name.startswith("transformer_blocks."):
        if ".attn." in name:
            return ATTENTION
        if ".ff." in name:
            return FEED_FORWARD
        return ADALN
    if name == "norm_out.linear":
        return ADALN
    return INPUT_OUTPUT


def is_block_linear(name: str) -> bool:
    """Whether a canonical target is one of the six ``BLOCK_LINEARS`` of a main or refiner block."""
    return name.startswith(("transformer_blocks.", "token_refiner.")) and name.endswith(BLOCK_LINEARS)


def transformer_shapes(config: Mapping[str, Any]) -> TransformerShapes:
    """All Linear shapes of the transformer described by ``config`` (a diffusers ``config.json`` dict).

    Missing keys take diffusers' defaults (the full-size model).
    """
    c = {**FULL_SIZE_CONFIG, **{k: v for k, v in config.items() if not k.startswith("_")}}
    hidden, heads, head_dim = int(c["hidden_size"]), int(c["num_attention_heads"]), int(c["attention_head_dim"])
    inner, ffn, temb = heads * head_dim, int(c["ffn_dim"]), int(c["time_embed_dim"])
    patch = c["patch_size"]
    video_patch = int(c["in_channels"]) * int(patch[0]) * int(patch[1]) * int(patch[2])
    audio = int(c["audio_in_channels"])

    shapes: dict[str, tuple[int, int]] = {
        "proj_in": (hidden, video_patch),
        "audio_proj_in": (hidden, audio),
        "context_embedder": (hidden, int(c["text_dim"])),
        "time_embedder.linear_1": (int(c["time_embed_hidden_dim"]), int(c["freq_dim"])),
        "time_embedder.linear_2": (temb, int(c["time_embed_hidden_dim"])),
    }

    def block(prefix: str, with_adaln: bool) -> None:
        for q in QKV:
            shapes[f"{prefix}.attn.{q}"] = (inner, hidden)
        shapes[f"{prefix}.attn.to_out.0"] = (hidden, inner)
        shapes[f"{prefix}.ff.net.0.proj"] = (2 * ffn, hidden)
        shapes[f"{prefix}.ff.net.2"] = (hidden, ffn)
        if with_adaln:
            shapes[f"{prefix}.adaln_proj.linear"] = (6 * hidden * 3, temb)

    for i in range(int(c["num_refiner_layers"])):
        block(f"token_refiner.refiner_blocks.{i}", with_adaln=False)
    for i in range(int(c["num_layers"])):
        block(f"transformer_blocks.{i}", with_adaln=True)
    shapes["norm_out.linear"] = (2 * hidden, temb)
    shapes["proj_out"] = (video_patch, hidden)
    shapes["audio_proj_out"] = (audio, hidden)

    linears = {name: LinearShape(name, out_f, in_f, group_of(name)) for name, (out_f, in_f) in shapes.items()}
    return TransformerShapes(
        linears=linears,
        num_layers=int(c["num_layers"]),
        num_refiner_layers=int(c["num_refiner_layers"]),
        heads=heads,
        head_dim=head_dim,
        hidden_size=hidden,
    )
