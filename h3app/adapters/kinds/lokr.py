"""LyCORIS LoKr (Kronecker product): ``ΔW = kron(W1, W2) · scale``.

``W1`` is ``lokr_w1 [a, b]`` or ``lokr_w1_a [a, r] @ lokr_w1_b [r, b]``; ``W2`` likewise (``lokr_w2`` or
``lokr_w2_a @ lokr_w2_b``); ``kron`` of ``[a, b]`` and ``[c, d]`` is ``[a·c, b·d]``, the module's ``[out, in]``.
scale = alpha / dim, dim the rank of the decomposed factor (W2's when both are decomposed, as ComfyUI's
``weight_adapter/lokr.py`` takes the later one); with both factors stored whole there is no dim and the scale is 1
(LyCORIS ``lokr.py`` sets alpha = dim then; ComfyUI uses 1): alpha does not apply. A Tucker core (``lokr_t2``) is
for conv layers, which H3 has none of (refused in ``refusals.py``).

The exact A/B pair: by the mixed-product rule ``kron(U1 V1, U2 V2) = kron(U1, U2) · kron(V1, V2)``, with a
decomposed factor ``U = w_a, V = w_b`` and a whole one ``U = I, V = W`` or ``U = W, V = I`` (the narrower side), so
``B = kron(U1, U2)`` and ``A = kron(V1, V2)``: no SVD, no rounding beyond fp32 products. Where that pair would be
wider than the layer (two whole factors, typically), the dense ``kron(W1, W2)`` is held with an identity instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ...errors import H3AppError
from .base import Kind, KindFacts, Shape, dense_pair, dtype_of, require

if TYPE_CHECKING:
    import torch

LABEL = "LoKr (LyCORIS Kronecker)"


def _factor(name: str, stem: str, factors: Mapping[str, tuple[str, Shape]], which: str) -> tuple[Shape, int | None]:
    """``(shape [rows, cols] of W<which>, its decomposed rank or None when stored whole)``."""
    whole, down, up = f"lokr_w{which}", f"lokr_w{which}_a", f"lokr_w{which}_b"
    if whole in factors and (down in factors or up in factors):
        raise H3AppError(f"{name}: LoKr module {stem!r} stores W{which} both whole ({whole}) and decomposed "
                         f"({down}/{up}): the file mixes two copies of one adapter; keep one.")
    if whole in factors:
        return factors[whole][1], None
    require(name, stem, LABEL, factors, down, up)
    (rows, rank), (rank_b, cols) = factors[down][1], factors[up][1]
    if rank != rank_b:
        raise H3AppError(f"{name}: LoKr module {stem!r} has {down} {list(factors[down][1])} and {up} "
                         f"{list(factors[up][1])}: their inner sizes differ; the file is damaged — re-export it.")
    return (rows, cols), rank


def facts(name: str, stem: str, factors: Mapping[str, tuple[str, Shape]]) -> KindFacts:
    require(name, stem, LABEL, factors)
    (a, b), rank1 = _factor(name, stem, factors, "1")
    (c, d), rank2 = _factor(name, stem, factors, "2")
    dim = rank2 if rank2 is not None else rank1
    width = (rank1 if rank1 is not None else min(a, b)) * (rank2 if rank2 is not None else min(c, d))
    out_features, in_features = a * c, b * d
    return KindFacts(rank=dim if dim is not None else 1, width=min(width, out_features, in_features),
                     shape=(out_features, in_features), dtype=dtype_of(factors), alpha_applies=dim is not None)


def _sides(tensors: Mapping[str, torch.Tensor], which: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(U, V)`` with ``U @ V`` = W<which>, fp32."""
    import torch

    whole = tensors.get(f"lokr_w{which}")
    if whole is None:
        return tensors[f"lokr_w{which}_a"].float(), tensors[f"lokr_w{which}_b"].float()
    rows, cols = whole.shape
    if rows <= cols:
        return torch.eye(rows, dtype=torch.float32), whole.float()
    return whole.float(), torch.eye(cols, dtype=torch.float32)


def pair(tensors: Mapping[str, torch.Tensor], found: KindFacts) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    (u1, v1), (u2, v2) = _sides(tensors, "1"), _sides(tensors, "2")
    if u1.shape[1] * u2.shape[1] > found.width:  # wider than the layer: hold kron(W1, W2) itself
        return dense_pair(torch.kron((u1.double() @ v1.double()), (u2.double() @ v2.double())).float())
    return torch.kron(v1, v2).contiguous(), torch.kron(u1, u2).contiguous()


KIND = Kind(name="lokr", label=LABEL, factors=r"lokr_w[12](?:_[ab])?", facts=facts, pair=pair)
