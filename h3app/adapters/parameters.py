"""Every parameter of an H3 transformer that an adapter's exact parts may touch, with its shape, from the config
alone (no torch): Linear weights ``[out, in]``, the biases of the Linears that have one ``[out]``, and the RMSNorm
weights ``[width]``. ``tests/test_adapters_extra_parts.py`` holds this table equal to the real model's
``named_parameters()``.

Names are the unfused diffusers parameter names (``proj_in.weight``, ``transformer_blocks.3.norm1.weight``). Native
(original checkpoint) module names are mapped onto them for the norms here and for the Linears by
``rules.module_rules``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..rules.h3_modules import TransformerShapes

WEIGHT, BIAS = "weight", "bias"
# The Linears built with ``bias=True`` in diffusers' MiniMaxH3Transformer3DModel (every block Linear has none).
_BIASED = re.compile(r"proj_in|audio_proj_in|context_embedder|time_embedder\.linear_[12]|norm_out\.linear|proj_out"
                     r"|audio_proj_out|transformer_blocks\.\d+\.adaln_proj\.linear")
# The output heads a head bank replaces, per evaluation.
BANK_MODULES = ("proj_out", "audio_proj_out")
# The AdaLN projections: their input is the 2688-wide time embedding (a pruned checkpoint feeds an 8-wide basis).
_ADALN = re.compile(r"transformer_blocks\.\d+\.adaln_proj\.linear|norm_out\.linear")

# Native norm names → diffusers ones (module names; ``.weight`` follows).
_NATIVE_NORMS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"blocks\.(\d+)\.(norm[12])"), r"transformer_blocks.\1.\2"),
    (re.compile(r"blocks\.(\d+)\.attn\.([qk])_norm"), r"transformer_blocks.\1.attn.norm_\2"),
    (re.compile(r"token_refiner\.blocks\.(\d+)\.(norm[12])"), r"token_refiner.refiner_blocks.\1.\2"),
    (re.compile(r"token_refiner\.blocks\.(\d+)\.attn\.([qk])_norm"), r"token_refiner.refiner_blocks.\1.attn.norm_\2"),
    (re.compile(r"final_layer\.norm"), "norm_out.norm"),
)


def is_adaln(module: str) -> bool:
    """Whether a canonical module is an AdaLN projection (a block's ``adaln_proj.linear`` or ``norm_out.linear``)."""
    return _ADALN.fullmatch(module) is not None


def native_norm(module: str) -> str | None:
    """The diffusers name of a native norm module (``blocks.3.attn.q_norm`` → ``transformer_blocks.3.attn.norm_q``)."""
    for pattern, replacement in _NATIVE_NORMS:
        if pattern.fullmatch(module):
            return pattern.sub(replacement, module)
    return None


def parameter_shapes(shapes: TransformerShapes) -> dict[str, tuple[int, ...]]:
    """Parameter name → shape for every parameter of the transformer ``shapes`` describes."""
    found: dict[str, tuple[int, ...]] = {}
    for name, linear in shapes.linears.items():
        found[f"{name}.{WEIGHT}"] = (linear.out_features, linear.in_features)
        if _BIASED.fullmatch(name):
            found[f"{name}.{BIAS}"] = (linear.out_features,)
    hidden, head_dim = shapes.hidden_size, shapes.head_dim
    blocks = [f"token_refiner.refiner_blocks.{i}" for i in range(shapes.num_refiner_layers)]
    blocks += [f"transformer_blocks.{i}" for i in range(shapes.num_layers)]
    for block in blocks:
        found[f"{block}.norm1.{WEIGHT}"] = (hidden,)
        found[f"{block}.norm2.{WEIGHT}"] = (hidden,)
        found[f"{block}.attn.norm_q.{WEIGHT}"] = (head_dim,)
        found[f"{block}.attn.norm_k.{WEIGHT}"] = (head_dim,)
    found[f"token_refiner.final_norm.{WEIGHT}"] = (hidden,)
    found[f"norm_out.norm.{WEIGHT}"] = (hidden,)
    return found


def linear_of(parameter: str, linears: Mapping[str, object]) -> str | None:
    """The Linear module whose weight ``parameter`` is (None for a bias, a norm, or an unknown name)."""
    module, _, attr = parameter.rpartition(".")
    return module if attr == WEIGHT and module in linears else None
