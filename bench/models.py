"""Transformers and inputs for the benchmarks: diffusers' own ``MiniMaxH3Transformer3DModel`` at chosen sizes, with
seeded random weights, and packed inputs of any sequence length.

Weights are allocated on the ``meta`` device and then materialised with seeded uniform values (1/√in scale), which
is several times faster than the constructor's default init at full width (6.5 s → about 1.5 s for one full-width
block on 2 cores); buffers (the rotary ``inv_freq``) are built normally.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch

from h3app.rules.frames import RELEASED

# The medium model of P2/P5 (issue 8): hidden 1024, 8 blocks + 2 refiner blocks, 8 heads × 128, ffn 2816.
MEDIUM_CONFIG: dict[str, Any] = {
    "num_attention_heads": 8, "attention_head_dim": 128, "hidden_size": 1024, "num_layers": 8,
    "num_refiner_layers": 2, "ffn_dim": 2816, "in_channels": 24, "audio_in_channels": 32, "patch_size": (1, 2, 2),
    "text_dim": 1024, "freq_dim": 256, "time_embed_hidden_dim": 1024, "time_embed_dim": 512, "rope_freq_dim": 16,
}

# P3: the real depth (50 blocks + 2 refiner blocks = 52, 312 LoRA targets) at a small width.
DEEP_NARROW_CONFIG: dict[str, Any] = {
    "num_attention_heads": 2, "attention_head_dim": 128, "hidden_size": 256, "num_layers": 50,
    "num_refiner_layers": 2, "ffn_dim": 512, "in_channels": 24, "audio_in_channels": 32, "patch_size": (1, 2, 2),
    "text_dim": 256, "freq_dim": 64, "time_embed_hidden_dim": 256, "time_embed_dim": 128, "rope_freq_dim": 16,
}


class MediumCase(NamedTuple):
    """P2/P5's subject: the medium transformer, its LightX2V-layout adapter file (rank ``rank`` on the six
    attention/FFN targets of all 10 blocks, fp32, alpha 8 in ``__metadata__``) and the number of targets."""

    transformer: torch.nn.Module
    adapter_path: Path
    targets: int
    rank: int


def medium_case(cache_dir: Path, rank: int = 128) -> MediumCase:
    """Build the medium model and write (once; then reuse) its adapter file under ``cache_dir``."""
    from .adapter_files import cached_adapter_file, lightx2v_layout

    specs = lightx2v_layout(MEDIUM_CONFIG, rank, torch.float32)
    path, _ = cached_adapter_file(cache_dir, "lightx2v-medium", specs, {"alpha": "8"})
    return MediumCase(build_transformer(MEDIUM_CONFIG), path, len(specs) // 2, rank)


def full_width_block_config() -> dict[str, Any]:
    """P4: one main block at the real width (hidden 5376, 56 heads × 128, ffn 14336, AdaLN from the real 2688-wide
    time embedding), no refiner block; the real input/output projections."""
    from h3app.rules.h3_modules import FULL_SIZE_CONFIG

    return {**FULL_SIZE_CONFIG, "num_layers": 1, "num_refiner_layers": 0, "patch_size": (1, 2, 2)}


def with_depth(config: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    return {**config, "num_layers": int(num_layers)}


def build_transformer(config: Mapping[str, Any], *, seed: int = 0, dtype: torch.dtype = torch.float32,
                      device: str | torch.device = "cpu") -> torch.nn.Module:
    """diffusers' H3 transformer for ``config`` with seeded random weights, eval mode, no gradients.

    Linear weights are uniform in ±1/√in (biases 0), norm weights 1 — activations keep a sane scale through any depth.
    """
    from accelerate import init_empty_weights
    from diffusers import MiniMaxH3Transformer3DModel

    with init_empty_weights(include_buffers=False):
        model = MiniMaxH3Transformer3DModel(**dict(config))
    generator = torch.Generator().manual_seed(seed)
    modules = dict(model.named_modules())
    for name, parameter in list(model.named_parameters()):
        owner_name, _, attr = name.rpartition(".")
        owner = modules[owner_name]
        value = torch.empty(parameter.shape, dtype=torch.float32)
        if isinstance(owner, torch.nn.Linear) and attr == "weight":
            bound = 1.0 / math.sqrt(parameter.shape[1])
            value.uniform_(-bound, bound, generator=generator)
        elif attr == "bias":
            value.zero_()
        else:
            value.fill_(1.0)
        owner._parameters[attr] = torch.nn.Parameter(value.to(device=device, dtype=dtype), requires_grad=False)
    return model.to(device).eval()


def shared_weight_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A second module tree over the *same* parameter and buffer tensors (no weight memory): adapters can be bound
    to each copy independently — ours on one, PEFT on another — as long as neither writes the weights (unmerged)."""
    import copy

    memo = {id(tensor): tensor for tensor in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo)


def packed_input(config: Mapping[str, Any], *, video_grid: tuple[int, int, int], audio_steps: int, text_rows: int,
                 seed: int = 0, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Keyword arguments of ``MiniMaxH3Transformer3DModel.forward`` for one packed sequence, laid out like
    ``h3app.backend.transformer_check.packed_check_input`` at any size: ``text_rows`` text rows | ``2 × audio_steps`` stereo
    audio rows (channel-major) | ``f × h × w`` video rows (``video_grid`` = latent frames × patch rows × patch
    columns). Text and video rows use timestep 0.7, audio rows 0.3. Latents are seeded standard normal (fp32)."""
    frames, height, width = video_grid
    patch = config.get("patch_size", (1, 2, 2))
    video_width = int(config["in_channels"]) * int(patch[0]) * int(patch[1]) * int(patch[2])
    video_rows, audio_rows = frames * height * width, 2 * audio_steps
    generator = torch.Generator().manual_seed(seed)
    video = torch.randn(1, video_rows, video_width, generator=generator)
    audio = torch.randn(1, audio_rows, int(config["audio_in_channels"]), generator=generator)
    text = torch.randn(1, text_rows, int(config["text_dim"]), generator=generator)

    length = text_rows + audio_rows + video_rows
    text_idx = torch.arange(0, text_rows)
    audio_idx = torch.arange(text_rows, text_rows + audio_rows)
    video_idx = torch.arange(text_rows + audio_rows, length)
    tags = torch.empty(length, dtype=torch.long)
    tags[text_idx], tags[audio_idx], tags[video_idx] = 1, 2, 0
    timestep_indices = torch.zeros(length, dtype=torch.long)
    timestep_indices[audio_idx] = 1
    positions = torch.zeros(length, 3)
    positions[text_idx, 0] = torch.arange(text_rows, dtype=torch.float32)
    steps = torch.arange(audio_steps, dtype=torch.float32)
    for channel in range(2):
        rows = audio_idx[channel * audio_steps:(channel + 1) * audio_steps]
        positions[rows, 0] = text_rows + steps
        positions[rows, 2] = float(channel)
    grid = torch.stack(torch.meshgrid(torch.arange(frames), torch.arange(height), torch.arange(width), indexing="ij"),
                       dim=-1).reshape(-1, 3).float()
    grid[:, 0] += text_rows
    positions[video_idx] = grid
    tensors = {
        "hidden_states": video, "audio_hidden_states": audio, "encoder_hidden_states": text,
        "timestep": torch.tensor([0.7, 0.3]), "timestep_indices": timestep_indices, "token_tags": tags,
        "position_ids": positions, "video_indices": video_idx, "audio_indices": audio_idx, "text_indices": text_idx,
    }
    return {name: tensor.to(device) for name, tensor in tensors.items()}


def packed_input_for_tokens(config: Mapping[str, Any], tokens: int, *, seed: int = 0,
                            device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """A packed input of exactly ``tokens`` rows in roughly a real request's proportions (≈ 1/16 text, 1/32 audio,
    the rest one video latent frame)."""
    if tokens < 8:
        raise ValueError(f"tokens must be >= 8, got {tokens}")
    text_rows = max(2, tokens // 16)
    audio_steps = max(1, tokens // 64)
    video_rows = tokens - text_rows - 2 * audio_steps
    return packed_input(config, video_grid=(1, 1, video_rows), audio_steps=audio_steps, text_rows=text_rows,
                        seed=seed, device=device)


def sequence_rows(height: int, width: int, frames: int, text_rows: int = 256) -> dict[str, int]:
    """The packed sequence of a real H3 request: video ``(5n + 2) × H/32 × W/32`` rows for ``17n + 5`` frames (16×
    spatial VAE compression × the 2×2 patch, 4× temporal), stereo audio at 40 latents/s per channel (32 kHz, hop
    800), plus ``text_rows`` text rows. 960×544×124 frames → 18,870 video + 414 audio rows."""
    aligned = RELEASED.aligned(frames)
    n = (aligned - RELEASED.latents_per_chunk) // RELEASED.frames_per_chunk
    latent_frames = 5 * n + 2
    seconds = aligned / RELEASED.fps
    audio_steps = math.ceil(seconds * 40.0)
    return {"latent_frames": latent_frames, "grid_h": height // 32, "grid_w": width // 32,
            "video": latent_frames * (height // 32) * (width // 32), "audio_steps": audio_steps,
            "audio": 2 * audio_steps, "text": text_rows}


def full_size_batch(height: int, width: int, frames: int, text_rows: int, device: Any
                    ) -> tuple[dict[str, int], dict[str, torch.Tensor]]:
    """The full-size transformer's packed input for one request size on ``device``: ``(sequence_rows, batch)``."""
    from h3app.rules.h3_modules import FULL_SIZE_CONFIG

    seq = sequence_rows(height, width, frames, text_rows)
    return seq, packed_input(FULL_SIZE_CONFIG, video_grid=(seq["latent_frames"], seq["grid_h"], seq["grid_w"]),
                             audio_steps=seq["audio_steps"], text_rows=seq["text"], device=device)


def linear_flops(config: Mapping[str, Any], tokens: int, text_rows: int, targets: Mapping[str, int] | None = None
                 ) -> dict[str, float]:
    """Multiply-add FLOPs (×2) of one forward at ``tokens`` rows: ``base`` (every Linear on the rows it sees —
    refiner blocks see text rows only, AdaLN sees the 2 timestep rows — plus attention ``QKᵀ`` and ``AV``) and
    ``lora`` (``2·rows·r·(in + out)`` for each target in ``targets``: name → rank)."""
    from h3app.rules.h3_modules import transformer_shapes

    shapes = transformer_shapes(config)
    inner = shapes.heads * shapes.head_dim
    base = 0.0
    lora = 0.0
    for name, linear in shapes.linears.items():
        rows = _rows_seen(name, tokens, text_rows)
        base += 2.0 * rows * linear.in_features * linear.out_features
        if targets and name in targets:
            lora += 2.0 * rows * targets[name] * (linear.in_features + linear.out_features)
    base += shapes.num_layers * 4.0 * tokens * tokens * inner
    base += shapes.num_refiner_layers * 4.0 * text_rows * text_rows * inner
    return {"base": base, "lora": lora}


def _rows_seen(name: str, tokens: int, text_rows: int) -> int:
    if name.startswith("token_refiner.") or name == "context_embedder":
        return text_rows
    if name.endswith("adaln_proj.linear") or name.startswith("time_embedder") or name == "norm_out.linear":
        return 2
    return tokens
