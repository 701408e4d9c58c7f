"""Small adapter files in the layouts published H3 adapters use beyond A/B pairs, built for the tiny checkpoint's
transformer (tests/adapter_fixtures.TINY_CONFIG), and the rule each applies, written out by hand with plain tensors.

- FastH3 (FastVideo): rank-r A/B pairs on every block Linear (diffusers names) plus exact deltas ``.diff`` /
  ``.diff_b`` on the boundary modules, some norm weights and the AdaLN biases; metadata ``format=fastvideo-lora-v2``.
- its VSA variant: the same plus ``attn.to_gate_compress.set_weight`` (a module the model does not have).
- PDD (alibaba-pai Acc): bare ``<module>.lora_down`` / ``.lora_up`` (no ``.weight``) and a head bank under plain
  parameter names (``proj_out.weight [n, out, in]`` …).
- a pruned-base file: AdaLN pairs whose ``lora_A`` reads an 8-wide basis and a constant AdaLN ``.diff_b``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from adapter_fixtures import TINY_SHAPES

from h3app.adapters.parameters import parameter_shapes
from h3app.rules.h3_modules import BLOCK_LINEARS

PARAMS = parameter_shapes(TINY_SHAPES)
BOUNDARY = ("proj_in", "audio_proj_in", "context_embedder", "time_embedder.linear_1", "time_embedder.linear_2",
            "norm_out.linear", "proj_out", "audio_proj_out")
NORM_DELTAS = ("norm_out.norm", "transformer_blocks.0.norm1", "transformer_blocks.1.attn.norm_q")
BANK_SIZE = 32


def _random(shape: tuple[int, ...], generator: torch.Generator, magnitude: float) -> torch.Tensor:
    return torch.randn(shape, generator=generator) * magnitude


def block_pairs(rank: int = 4, seed: int = 0, *, adaln: bool = True, suffix: str = ".weight",
                names: tuple[str, str] = ("lora_A", "lora_B")) -> dict[str, torch.Tensor]:
    """A/B pairs on every main-block Linear (+ AdaLN) and refiner-block Linear, diffusers names."""
    generator = torch.Generator().manual_seed(seed)
    down, up = names
    tensors: dict[str, torch.Tensor] = {}
    for target, linear in TINY_SHAPES.linears.items():
        block = target.startswith(("transformer_blocks.", "token_refiner."))
        if not block or not (target.endswith(BLOCK_LINEARS) or adaln and target.endswith("adaln_proj.linear")):
            continue
        tensors[f"{target}.{down}{suffix}"] = _random((rank, linear.in_features), generator, 0.2)
        tensors[f"{target}.{up}{suffix}"] = _random((linear.out_features, rank), generator, 0.2)
    return tensors


def fasth3_tensors(seed: int = 1) -> dict[str, torch.Tensor]:
    """FastH3's layout: pairs on the blocks, exact fp32 deltas on the boundary modules, norms and AdaLN biases."""
    generator = torch.Generator().manual_seed(seed)
    tensors = block_pairs(seed=seed)
    for module in BOUNDARY:
        tensors[f"{module}.diff"] = _random(PARAMS[f"{module}.weight"], generator, 0.05)
        tensors[f"{module}.diff_b"] = _random(PARAMS[f"{module}.bias"], generator, 0.05)
    for module in NORM_DELTAS:
        tensors[f"{module}.diff"] = _random(PARAMS[f"{module}.weight"], generator, 0.05)
    for index in range(TINY_SHAPES.num_layers):
        module = f"transformer_blocks.{index}.adaln_proj.linear"
        tensors[f"{module}.diff_b"] = _random(PARAMS[f"{module}.bias"], generator, 0.05)
    return tensors


FASTH3_METADATA = {"format": "fastvideo-lora-v2"}


def vsa_tensors() -> dict[str, torch.Tensor]:
    gates = {f"transformer_blocks.{i}.attn.to_gate_compress.set_weight": torch.zeros(2, 24)
             for i in range(TINY_SHAPES.num_layers)}
    return {**fasth3_tensors(), **gates}


def pdd_tensors(seed: int = 2, size: int = BANK_SIZE) -> dict[str, torch.Tensor]:
    """PDD's layout: bare ``lora_down``/``lora_up`` (no ``.weight``) on the blocks and a bank of ``size`` heads."""
    generator = torch.Generator().manual_seed(seed)
    tensors = block_pairs(seed=seed, suffix="", names=("lora_down", "lora_up"))
    for module in ("proj_out", "audio_proj_out"):
        out_features, in_features = PARAMS[f"{module}.weight"]
        tensors[f"{module}.weight"] = _random((size, out_features, in_features), generator, 0.3)
        tensors[f"{module}.bias"] = _random((size, out_features), generator, 0.05)
    return tensors


PRUNED_WIDTH = 8


def pruned_tensors(seed: int = 3) -> dict[str, torch.Tensor]:
    """Pairs on the blocks with the AdaLN pairs against an 8-wide basis, and the constant AdaLN ``.diff_b``."""
    generator = torch.Generator().manual_seed(seed)
    tensors = block_pairs(seed=seed, adaln=False)
    for index in range(TINY_SHAPES.num_layers):
        module = f"transformer_blocks.{index}.adaln_proj.linear"
        out_features = PARAMS[f"{module}.weight"][0]
        tensors[f"{module}.lora_A.weight"] = _random((4, PRUNED_WIDTH), generator, 0.2)
        tensors[f"{module}.lora_B.weight"] = _random((out_features, 4), generator, 0.2)
        tensors[f"{module}.diff_b"] = _random((out_features,), generator, 0.05)
    return tensors


def apply_by_hand(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor], strength: float, *,
                  lora_scale: float | None = None, skip_adaln: bool = False) -> None:
    """The rule, applied to ``model``'s parameters with plain tensors (fp32): ``W += strength · diff`` for every
    ``.diff``/``.diff_b``, ``W = set`` for every ``.set_weight``/``.set_bias``, and ``W += lora_scale · B @ A`` for
    every pair (``lora_scale`` None: strength × alpha / rank with alpha = rank, i.e. strength)."""
    params = dict(model.named_parameters())
    scale = strength if lora_scale is None else lora_scale
    with torch.no_grad():
        for key, tensor in tensors.items():
            stem, _, kind = key.rpartition(".")
            if skip_adaln and "adaln_proj" in stem:
                continue
            if kind in ("diff", "diff_b", "set_weight", "set_bias"):
                parameter = params[f"{stem}.{'bias' if kind.endswith('_b') or kind == 'set_bias' else 'weight'}"]
                if kind.startswith("set_"):
                    parameter.copy_(tensor)
                else:
                    parameter.copy_(parameter.float() + strength * tensor.float())
        for key, tensor in tensors.items():
            for down_name, up_name in (("lora_A", "lora_B"), ("lora_down", "lora_up")):
                if key.endswith(f".{down_name}.weight") or key.endswith(f".{down_name}"):
                    stem = key[:key.rindex(f".{down_name}")]
                    if skip_adaln and "adaln_proj" in stem:
                        continue
                    up = tensors[key.replace(f".{down_name}", f".{up_name}")]
                    params[f"{stem}.weight"].add_(scale * (up.double() @ tensor.double()).float())
