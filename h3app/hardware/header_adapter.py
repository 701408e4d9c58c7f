"""A full-size adapter from a safetensors header alone: h3app's own plan, alpha chain and factor split, with fake
factors of the header's shapes and dtype (no weight bytes exist or are read).

``lightx2v_header`` writes the header of a LightX2V-style adapter (diffusers names with ``.default.``, rank ``r`` on
every Linear of the 50 + 2 blocks: 312 targets at full size) so the rehearsal needs no file at all; a real header
(``adapters.header.read_local_header``, or a remote one) works the same way.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..adapters.alpha import resolve_alphas
from ..adapters.header import make_header_view
from ..adapters.inspect import analyse_header
from ..adapters.normalise import split_factors
from ..adapters.types import HeaderView, ModuleLoRA, NormalisedAdapter
from ..rules.choices import MAIN_PARTITION
from ..rules.h3_modules import TransformerShapes, is_block_linear

_DTYPE_NAMES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
_NAME_DTYPES = {**{v: k for k, v in _DTYPE_NAMES.items()}, "F8_E4M3": torch.float8_e4m3fn}


def lightx2v_header(shapes: TransformerShapes, rank: int = 128, dtype: torch.dtype = torch.bfloat16,
                    alpha: float | None = 8.0, name: str = "lightx2v_shaped.safetensors") -> HeaderView:
    """The header of a LightX2V-shaped adapter for ``shapes``: ``lora_A [r, in]`` / ``lora_B [out, r]`` per
    attention and feed-forward Linear of every main and refiner block; ``alpha`` in the metadata (None: none)."""
    tensors: dict[str, tuple[str, tuple[int, ...], tuple[int, int]]] = {}
    size = torch.empty((), dtype=dtype).element_size()
    offset = 0
    for target, linear in shapes.linears.items():
        if not is_block_linear(target):
            continue
        for key, shape in ((f"{target}.lora_A.default.weight", (rank, linear.in_features)),
                           (f"{target}.lora_B.default.weight", (linear.out_features, rank))):
            nbytes = shape[0] * shape[1] * size
            tensors[key] = (_DTYPE_NAMES[dtype], shape, (offset, offset + nbytes))
            offset += nbytes
    metadata = {"alpha": f"{alpha:g}"} if alpha is not None else {}
    return make_header_view(tensors, metadata, {}, None, offset, name)


def adapter_from_header(view: HeaderView, shapes: TransformerShapes, *, partition: str = MAIN_PARTITION,
                        qkv_layout: str = "auto", explicit_alpha: float | None = None) -> NormalisedAdapter:
    """``view`` normalised by h3app's own code (plan, shape check, alpha chain, q/k/v split, SwiGLU swap), each
    factor an uninitialised CPU tensor of the header's shape and dtype (fake under fake CUDA when large)."""
    analysis = analyse_header(view, shapes=shapes, qkv_layout=qkv_layout, partition=partition,
                              explicit_alpha=explicit_alpha)
    reference_alphas = resolve_alphas(analysis.plan.reference_modules, view, explicit_alpha=explicit_alpha,
                                      known=analysis.known).choices
    modules = _normalise(analysis.plan.modules, view, shapes, analysis.alphas.choices)
    reference = _normalise(analysis.plan.reference_modules, view, shapes, reference_alphas)
    return NormalisedAdapter(info=analysis.info, modules=modules, unmatched_keys=analysis.plan.unmatched_keys,
                             reference_modules=reference, identity=f"header:{view.name}:{view.file_bytes}")


def _normalise(plans: Any, view: HeaderView, shapes: TransformerShapes,
               choices: Mapping[str, Any]) -> dict[str, ModuleLoRA]:
    result: dict[str, ModuleLoRA] = {}
    for plan in plans:
        down, up = (_factor(view, key) for key in (plan.down_key, plan.up_key))
        for target, (target_down, target_up) in zip(plan.targets, split_factors(plan, down, up,
                                                                                 head_dim=shapes.head_dim)):
            choice = choices[target]
            result[target] = ModuleLoRA(target=target, down=target_down, up=target_up, alpha=choice.alpha,
                                        alpha_source=choice.source, use_rslora=choice.use_rslora,
                                        source_keys=plan.keys)
    return result


def _factor(view: HeaderView, key: str) -> torch.Tensor:
    dtype_name, shape = view.tensors[key]
    return torch.empty(tuple(shape), dtype=_NAME_DTYPES.get(dtype_name, torch.float32))


def factor_bytes(adapter: NormalisedAdapter, element_size: int = 4) -> int:
    """Bytes of ``adapter``'s factors at ``element_size`` bytes each (the engine keeps them in fp32)."""
    seen: dict[int, torch.Tensor] = {}
    for module in adapter.modules.values():
        seen[id(module.down)], seen[id(module.up)] = module.down, module.up
    return sum(t.numel() for t in seen.values()) * element_size
