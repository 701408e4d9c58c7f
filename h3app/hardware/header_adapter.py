"""A full-size adapter from a safetensors header alone: h3app's own plan, alpha chain and factor split, with fake
factors of the header's shapes and dtype (no weight bytes exist or are read).

``lightx2v_header`` writes the header of a LightX2V-style adapter (diffusers names with ``.default.``, rank ``r`` on
every Linear of the 50 + 2 blocks: 312 targets at full size) so the rehearsal needs no file at all; a real header
(``adapters.header.read_local_header``, or a remote one) works the same way.
"""

from __future__ import annotations

import torch

from ..adapters.header import make_header_view
from ..adapters.inspect import analyse_header
from ..adapters.normalise import normalise
from ..adapters.types import HeaderView, NormalisedAdapter
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
    return normalise(analysis, lambda key: _factor(view, key), shapes=shapes,
                     identity=f"header:{view.name}:{view.file_bytes}")


def _factor(view: HeaderView, key: str) -> torch.Tensor:
    """An uninitialised tensor of ``key``'s shape and dtype in the header (unknown dtypes: fp32)."""
    dtype_name, shape = view.tensors[key]
    return torch.empty(tuple(shape), dtype=_NAME_DTYPES.get(dtype_name, torch.float32))


def factor_bytes(adapter: NormalisedAdapter, element_size: int = 4) -> int:
    """Bytes of ``adapter``'s factors at ``element_size`` bytes each (the engine keeps them in fp32)."""
    seen: dict[int, torch.Tensor] = {}
    for module in adapter.modules.values():
        seen[id(module.down)], seen[id(module.up)] = module.down, module.up
    return sum(t.numel() for t in seen.values()) * element_size
