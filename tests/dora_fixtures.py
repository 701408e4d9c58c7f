"""DoRA files in PEFT's spelling (``lora_magnitude_vector``) and kohya/LyCORIS's (``dora_scale``), for given base
weights, and the weight PEFT's rule gives, computed here in float64 from the base weights (never through h3app):
``W' = m ⊙ (W + s·BA) / ‖W + s·BA‖_row``, ``s = alpha / rank × strength``; written as an exact-delta file
(``<target>.diff = W' − W``, applied at strength 1).

Nothing here is a test.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from adapter_fixtures import save

# canonical target → the module it sits in, in the kohya spelling (native names: fused QKV, fc1 [gate; up]).
PEFT_TARGETS = ("transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_out.0",
                "transformer_blocks.1.ff.net.0.proj", "transformer_blocks.1.ff.net.2")


def dora_weight(W: torch.Tensor, down: torch.Tensor, up: torch.Tensor, magnitude: torch.Tensor, s: float) -> torch.Tensor:
    """PEFT's DoRA weight, float64: ``m ⊙ (W + s·BA) / ‖W + s·BA‖_row`` (``torch.linalg.norm(…, dim=1)``)."""
    adapted = W.double() + s * (up.double() @ down.double())
    return magnitude.double()[:, None] * adapted / torch.linalg.norm(adapted, dim=1)[:, None]


def _factors(W: torch.Tensor, rank: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out_features, in_features = W.shape
    down = torch.randn(rank, in_features, generator=generator) * 0.3
    up = torch.randn(out_features, rank, generator=generator) * 0.3
    # A trained magnitude sits near the base row norms: ±20 %.
    magnitude = torch.linalg.norm(W.float(), dim=1) * (1 + 0.2 * torch.randn(out_features, generator=generator))
    return down, up, magnitude


def peft_dora_file(path: Path, weights: Mapping[str, torch.Tensor], *, rank: int = 2, alpha: float = 4.0,
                   seed: int = 0) -> tuple[Path, dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """A diffusers/PEFT DoRA file (``transformer.<target>.lora_A/B.weight``, ``.lora_magnitude_vector``, alpha in
    ``lora_adapter_metadata``) for ``weights`` (target → base weight) and its factors per target."""
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    factors = {}
    for target, W in weights.items():
        down, up, magnitude = _factors(W, rank, generator)
        factors[target] = (down, up, magnitude)
        tensors.update({f"transformer.{target}.lora_A.weight": down, f"transformer.{target}.lora_B.weight": up,
                        f"transformer.{target}.lora_magnitude_vector": magnitude})
    metadata = {"lora_adapter_metadata": json.dumps({"transformer.r": rank, "transformer.lora_alpha": alpha,
                                                     "transformer.use_dora": True})}
    return save(path, tensors, metadata), factors


def kohya_dora_file(path: Path, weights: Mapping[str, torch.Tensor], *, rank: int = 2, alpha: float = 4.0,
                    seed: int = 0) -> tuple[Path, dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """A kohya/LyCORIS DoRA on native fused modules: ``lora_unet_blocks_0_attn_qkv_proj`` (``weights`` holds the
    block's to_q/to_k/to_v) and ``lora_unet_blocks_1_mlp_fc1`` (``ff.net.0.proj``, rows written [gate; up]), with
    ``.alpha`` and ``dora_scale [out, 1]``; returns the canonical factors per target."""
    generator = torch.Generator().manual_seed(seed)
    qkv = [weights[f"transformer_blocks.0.attn.to_{p}"] for p in "qkv"]
    fc1 = weights["transformer_blocks.1.ff.net.0.proj"]
    down_qkv, up_qkv, mag_qkv = _factors(torch.cat(qkv), rank, generator)
    down_fc1, up_fc1, mag_fc1 = _factors(fc1, rank, generator)  # canonical rows [up; gate]
    half = fc1.shape[0] // 2
    swap = torch.cat([torch.arange(half, 2 * half), torch.arange(half)])  # → native [gate; up]
    tensors = {
        "lora_unet_blocks_0_attn_qkv_proj.lora_down.weight": down_qkv, "lora_unet_blocks_0_attn_qkv_proj.lora_up.weight": up_qkv,
        "lora_unet_blocks_0_attn_qkv_proj.dora_scale": mag_qkv[:, None], "lora_unet_blocks_0_attn_qkv_proj.alpha": torch.tensor(alpha),
        "lora_unet_blocks_1_mlp_fc1.lora_down.weight": down_fc1, "lora_unet_blocks_1_mlp_fc1.lora_up.weight": up_fc1[swap],
        "lora_unet_blocks_1_mlp_fc1.dora_scale": mag_fc1[swap][:, None], "lora_unet_blocks_1_mlp_fc1.alpha": torch.tensor(alpha),
    }
    rows = qkv[0].shape[0]
    factors = {f"transformer_blocks.0.attn.to_{p}": (down_qkv, up_qkv[i * rows:(i + 1) * rows], mag_qkv[i * rows:(i + 1) * rows])
               for i, p in enumerate("qkv")}
    factors["transformer_blocks.1.ff.net.0.proj"] = (down_fc1, up_fc1, mag_fc1)
    return save(path, tensors), factors


def dora_delta_file(path: Path, weights: Mapping[str, torch.Tensor],
                    factors: Mapping[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]], s: float) -> Path:
    """PEFT's rule at scale ``s`` as ``<target>.diff = W' − W`` (fp32; load it at strength 1)."""
    return save(path, {f"{t}.diff": (dora_weight(weights[t], *factors[t], s) - weights[t].double()).float()
                       for t in factors})


def base_weights(model: torch.nn.Module, targets) -> dict[str, torch.Tensor]:
    return {t: model.get_submodule(t).weight.detach().clone() for t in targets}
