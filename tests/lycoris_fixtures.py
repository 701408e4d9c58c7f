"""Writers of LyCORIS LoKr / LoHa files in every key spelling, and the independent ΔW of each (the formula computed
here with ``torch.kron`` and dense products in float64, never through h3app), written as an exact-delta file.

Nothing here is a test. Module names: a native name (``blocks.0.attn.qkv_proj``, fused QKV rows [q; k; v],
``blocks.0.mlp.fc1`` rows [gate; up]) or a diffusers name (``transformer_blocks.0.attn.to_q``); the canonical ΔW
of each target follows the documented mapping (thirds of a QKV; fc1's halves swapped).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from adapter_fixtures import TINY_SHAPES, save

# Spelling → (prefix, names: "native" or "diffusers", flattened).
SPELLINGS: dict[str, tuple[str, str, bool]] = {
    "bare": ("", "native", False),
    "diffusion_model": ("diffusion_model.", "native", False),
    "transformer": ("transformer.", "diffusers", False),
    "lora_unet": ("lora_unet_", "native", True),
    "lycoris": ("lycoris_", "diffusers", True),
}
NATIVE_MODULES = ("blocks.0.attn.qkv_proj", "blocks.1.mlp.fc1", "blocks.0.attn.out_proj")
DIFFUSERS_MODULES = ("transformer_blocks.0.attn.to_q", "transformer_blocks.1.ff.net.0.proj",
                     "transformer_blocks.0.attn.to_out.0", "transformer_blocks.1.adaln_proj.linear")


def module_shape(module: str) -> tuple[int, int]:
    """``(out, in)`` of a native or diffusers module of the tiny transformer (fused rows for QKV)."""
    for canonical, rows in _native_targets(module):
        linear = TINY_SHAPES.linears[canonical]
        return linear.out_features * rows, linear.in_features
    linear = TINY_SHAPES.linears[module]
    return linear.out_features, linear.in_features


def _native_targets(module: str) -> list[tuple[str, int]]:
    block = module.split(".")[1] if module.startswith("blocks.") else None
    if block is None:
        return []
    if module.endswith("attn.qkv_proj"):
        return [(f"transformer_blocks.{block}.attn.to_q", 3)]
    return [(module.replace("blocks.", "transformer_blocks.", 1).replace("mlp.fc1", "ff.net.0.proj")
             .replace("mlp.fc2", "ff.net.2").replace("attn.out_proj", "attn.to_out.0"), 1)]


def canonical_deltas(module: str, delta: torch.Tensor) -> dict[str, torch.Tensor]:
    """The module's ΔW ``[out, in]`` as canonical targets: QKV thirds, fc1 [gate; up] → [up; gate]."""
    if not module.startswith("blocks."):
        return {module: delta}
    block = module.split(".")[1]
    if module.endswith("attn.qkv_proj"):
        q, k, v = delta.chunk(3, dim=0)
        return {f"transformer_blocks.{block}.attn.{name}": part for name, part in zip(("to_q", "to_k", "to_v"), (q, k, v))}
    if module.endswith("mlp.fc1"):
        gate, up = delta.chunk(2, dim=0)
        return {f"transformer_blocks.{block}.ff.net.0.proj": torch.cat([up, gate])}
    ((target, _),) = _native_targets(module)
    return {target: delta}


def stem(spelling: str, module: str) -> str:
    prefix, _, flattened = SPELLINGS[spelling]
    return prefix + (module.replace(".", "_") if flattened else module)


def modules_for(spelling: str) -> tuple[str, ...]:
    return NATIVE_MODULES if SPELLINGS[spelling][1] == "native" else DIFFUSERS_MODULES


def _random(shape: tuple[int, ...], generator: torch.Generator, magnitude: float) -> torch.Tensor:
    return torch.randn(shape, generator=generator) * magnitude


def _split(size: int) -> tuple[int, int]:
    """A LyCORIS-like factorisation ``size = small × large`` (small the largest divisor ≤ √size, at least 2)."""
    small = max(d for d in range(1, int(size ** 0.5) + 1) if size % d == 0)
    return small, size // small


def lokr_factors(module: str, *, seed: int, rank: int | None = 2, whole_w1: bool = True,
                 magnitude: float = 0.3) -> dict[str, torch.Tensor]:
    """LoKr factors of ``module``: W1 ``[a, b]`` whole (or decomposed with ``rank``), W2 ``[c, d]`` decomposed with
    ``rank`` (``rank`` None: W2 whole too), ``a·c = out``, ``b·d = in``."""
    out_features, in_features = module_shape(module)
    (a, c), (b, d) = _split(out_features), _split(in_features)
    generator = torch.Generator().manual_seed(seed)
    found: dict[str, torch.Tensor] = {}
    if whole_w1 or rank is None:
        found["lokr_w1"] = _random((a, b), generator, magnitude)
    else:
        found["lokr_w1_a"], found["lokr_w1_b"] = _random((a, rank), generator, magnitude), _random((rank, b), generator, magnitude)
    if rank is None:
        found["lokr_w2"] = _random((c, d), generator, magnitude)
    else:
        found["lokr_w2_a"], found["lokr_w2_b"] = _random((c, rank), generator, magnitude), _random((rank, d), generator, magnitude)
    return found


def loha_factors(module: str, *, seed: int, rank: int = 2, magnitude: float = 0.5) -> dict[str, torch.Tensor]:
    out_features, in_features = module_shape(module)
    generator = torch.Generator().manual_seed(seed)
    return {"hada_w1_a": _random((out_features, rank), generator, magnitude),
            "hada_w1_b": _random((rank, in_features), generator, magnitude),
            "hada_w2_a": _random((out_features, rank), generator, magnitude),
            "hada_w2_b": _random((rank, in_features), generator, magnitude)}


def lokr_delta(factors: Mapping[str, torch.Tensor], alpha: float | None) -> torch.Tensor:
    """The LoKr formula, float64: kron(W1, W2) · alpha / dim (dim: W2's rank if decomposed, else W1's; no dim: 1)."""
    def whole(which: str) -> tuple[torch.Tensor, int | None]:
        if f"lokr_w{which}" in factors:
            return factors[f"lokr_w{which}"].double(), None
        down, up = factors[f"lokr_w{which}_a"].double(), factors[f"lokr_w{which}_b"].double()
        return down @ up, up.shape[0]

    (w1, rank1), (w2, rank2) = whole("1"), whole("2")
    dim = rank2 if rank2 is not None else rank1
    scale = 1.0 if dim is None else (alpha if alpha is not None else dim) / dim
    return torch.kron(w1, w2) * scale


def loha_delta(factors: Mapping[str, torch.Tensor], alpha: float | None) -> torch.Tensor:
    """The LoHa formula, float64: (w1a @ w1b) ⊙ (w2a @ w2b) · alpha / rank (rank = w1b's rows)."""
    f = {k: v.double() for k, v in factors.items()}
    rank = f["hada_w1_b"].shape[0]
    return (f["hada_w1_a"] @ f["hada_w1_b"]) * (f["hada_w2_a"] @ f["hada_w2_b"]) * (alpha if alpha is not None else rank) / rank


FORMULAS = {"lokr": lokr_delta, "loha": loha_delta}


def kind_file(path: Path, kind: str, spelling: str, *, seed: int = 0, alpha: float | None = 4.0,
              modules: tuple[str, ...] | None = None, **options) -> tuple[Path, dict[str, torch.Tensor]]:
    """A ``kind`` ("lokr"/"loha") file in ``spelling`` over ``modules`` (default: that spelling's set) and the
    independent canonical ΔW (float64, at strength 1) of every target."""
    tensors: dict[str, torch.Tensor] = {}
    expected: dict[str, torch.Tensor] = {}
    for index, module in enumerate(modules or modules_for(spelling)):
        make = lokr_factors if kind == "lokr" else loha_factors
        factors = make(module, seed=seed + index, **options)
        key_stem = stem(spelling, module)
        tensors.update({f"{key_stem}.{name}": tensor for name, tensor in factors.items()})
        if alpha is not None:
            tensors[f"{key_stem}.alpha"] = torch.tensor(float(alpha))
        expected.update(canonical_deltas(module, FORMULAS[kind](factors, alpha)))
    return save(path, tensors), expected


def delta_file(path: Path, deltas: Mapping[str, torch.Tensor]) -> Path:
    """The independent ΔW written as an exact-delta file (``<target>.diff``, fp32): ``W + strength · ΔW``."""
    return save(path, {f"{target}.diff": delta.float() for target, delta in deltas.items()})
