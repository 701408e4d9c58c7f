"""LyCORIS LoHa (Hadamard product): ``ΔW = (w1_a @ w1_b) ⊙ (w2_a @ w2_b) · alpha / rank``, rank = ``w1_b``'s rows
(LyCORIS ``loha.py``, ComfyUI ``weight_adapter/loha.py``). A Tucker core (``hada_t1``/``hada_t2``) is for conv
layers, which H3 has none of (refused in ``refusals.py``).

The exact A/B pair: a Hadamard product of two low-rank products is one low-rank product of width ``r1·r2`` (the
face-splitting rule), ``B[:, k·r2 + l] = w1_a[:, k] ⊙ w2_a[:, l]`` and ``A[k·r2 + l] = w1_b[k] ⊙ w2_b[l]``; where
that is wider than the layer the dense product is held with an identity instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ...errors import H3AppError
from .base import Kind, KindFacts, Shape, dense_pair, dtype_of, require

if TYPE_CHECKING:
    import torch

LABEL = "LoHa (LyCORIS Hadamard)"
_FACTORS = ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b")


def facts(name: str, stem: str, factors: Mapping[str, tuple[str, Shape]]) -> KindFacts:
    require(name, stem, LABEL, factors, *_FACTORS)
    (out1, rank1), (rank1b, in1) = factors["hada_w1_a"][1], factors["hada_w1_b"][1]
    (out2, rank2), (rank2b, in2) = factors["hada_w2_a"][1], factors["hada_w2_b"][1]
    if rank1 != rank1b or rank2 != rank2b or (out1, in1) != (out2, in2):
        shapes = ", ".join(f"{f} {list(factors[f][1])}" for f in _FACTORS)
        raise H3AppError(f"{name}: LoHa module {stem!r} has {shapes}: the two products do not have one shape; the "
                         "file is damaged — re-export it.")
    return KindFacts(rank=rank1, width=min(rank1 * rank2, out1, in1), shape=(out1, in1), dtype=dtype_of(factors))


def pair(tensors: Mapping[str, torch.Tensor], found: KindFacts) -> tuple[torch.Tensor, torch.Tensor]:
    w1a, w1b, w2a, w2b = (tensors[f].float() for f in _FACTORS)
    out_features, in_features = found.shape
    rank1, rank2 = w1b.shape[0], w2b.shape[0]
    if rank1 * rank2 > found.width:  # wider than the layer: hold the dense product
        return dense_pair(((w1a.double() @ w1b.double()) * (w2a.double() @ w2b.double())).float())
    up = (w1a[:, :, None] * w2a[:, None, :]).reshape(out_features, rank1 * rank2)
    down = (w1b[:, None, :] * w2b[None, :, :]).reshape(rank1 * rank2, in_features)
    return down.contiguous(), up.contiguous()


KIND = Kind(name="loha", label=LABEL, factors=r"hada_w[12]_[ab]", facts=facts, pair=pair)
