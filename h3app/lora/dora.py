"""DoRA on one Linear, PEFT's rule (``peft/tuners/lora/dora.py``, which diffusers loads; kohya/LyCORIS
``dora_scale`` files are mapped onto it by diffusers' own converter):

    W' = m ⊙ (W + s·B A) / ‖W + s·B A‖_row        s = alpha · strength (· group, block, step) / rank

``m [out]`` is the magnitude, ``‖·‖_row`` the norm of each output row (``torch.linalg.norm(W + s·BA, dim=1)``), ``W``
the base weight. The magnitude applies at any strength (at s = 0, W' = m/‖W‖ ⊙ W, not W): "off" is detaching the
adapter, never strength 0 (``backend.adapter_binding.baseline`` detaches a DoRA adapter).

Cheap slider moves: the row norm at any s comes from three ``[out]`` vectors measured once at attach,
``‖W + sBA‖² = ‖W‖² + 2s·⟨W, BA⟩ + s²·‖BA‖²`` per row (``⟨W, BA⟩ = rowsum((W Aᵀ) ⊙ B)``,
``‖BA‖² = rowsum((B·A Aᵀ) ⊙ B)``: no ``[out, in]`` product is formed). Each forward recomputes
``c = m / ‖W + sBA‖`` from the shared scale tensor (O(out)), so a slider change costs what a LoRA's costs.

As a delta on the base output (PEFT's unmerged form): ``Δy = (c − 1) ⊙ (W x) + c ⊙ s·B(A x)``, ``W x`` being the
base output less its bias; merged: ``W += (c − 1) ⊙ W0 + c ⊙ s·BA`` from the pristine rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from ..errors import H3AppError
from .delta import compute_lora_delta
from .layers import LoRAFactors, rows_per_chunk
from .rows import RowFactors
from .scaling import ScaleEntry


def dora_norm_terms(base_rows: Callable[[int, int], torch.Tensor], out_features: int, in_features: int,
                    down: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``[3, out]`` float64: per output row ``‖W‖²``, ``⟨W, BA⟩`` and ``‖BA‖²`` for the base rows ``base_rows(start,
    stop)`` and factors ``A [r, in]``, ``B [out, r]``, by row chunks."""
    device = base_rows(0, 1).device  # measured where the weight lives (a GPU: no host round trip of the weight)
    A, B = down.to(device, torch.float64), up.to(device, torch.float64)
    gram = A @ A.T
    terms = torch.empty(3, out_features, dtype=torch.float64, device=device)
    step = rows_per_chunk(in_features)
    for start in range(0, out_features, step):
        stop = min(start + step, out_features)
        W = base_rows(start, stop).to(device, torch.float64)
        rows_B = B[start:stop]
        terms[0, start:stop] = W.pow(2).sum(dim=1)
        terms[1, start:stop] = ((W @ A.T) * rows_B).sum(dim=1)
        terms[2, start:stop] = ((rows_B @ gram) * rows_B).sum(dim=1)
    return terms



class DoRAFactors(LoRAFactors):
    """One DoRA adapter on one Linear: the factors, the magnitude ``m [out]`` and the norm terms ``[3, out]`` (fp32,
    on the factors' device), the base's bias (subtracted from the base output: ``W x``)."""

    needs_base = True

    def __init__(self, adapter: str, scale: ScaleEntry, down: torch.Tensor, up: torch.Tensor, magnitude: torch.Tensor,
                 terms: torch.Tensor, bias: torch.Tensor | None, modality: RowFactors | None = None) -> None:
        super().__init__(adapter, scale, down, up, modality)
        self.magnitude = magnitude.float()
        self.terms = terms.float()
        self.bias = bias

    def row_factor(self) -> torch.Tensor:
        """``c = m / ‖W + s·BA‖_row`` at the scale now in force, fp32 ``[out]``."""
        s = self.scale.applied
        assert s is not None, "a bound entry's scale is filled at creation"
        norm_sq = self.terms[0] + s * (2 * self.terms[1] + s * self.terms[2])
        return self.magnitude / norm_sq.clamp_min(0).sqrt()

    def delta(self, x: torch.Tensor, rows: torch.Tensor | None = None,
              base: torch.Tensor | None = None) -> torch.Tensor:
        """``(c − 1) ⊙ (base − bias) + c ⊙ s·(x Aᵀ) Bᵀ`` for input ``x`` and its base output ``base``."""
        assert base is not None, "a DoRA delta needs the base output"
        c = self.row_factor()
        lora = compute_lora_delta(x, self.down, self.up, scale=self.scale.applied, row_scales=rows)
        plain = base - self.bias if self.bias is not None else base
        return (lora.float() * c + plain.float() * (c - 1)).to(lora.dtype)

    def add_to_weight(self, weight32: torch.Tensor, start: int, stop: int,
                      base: torch.Tensor | None = None) -> None:
        """Rows ``[start, stop)``: ``+= (c − 1) ⊙ W0 + c ⊙ s·BA``, ``base`` the W0 rows in fp32."""
        assert base is not None, "a DoRA merge needs the base rows"
        c = self.row_factor()[start:stop, None].to(weight32.device)
        lora = (self.up[start:stop].float() @ self.down.float()) * self.scale_values()[0]
        weight32.add_(lora * c + base * (c - 1))

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.magnitude.nbytes + self.terms.nbytes


def refuse_dora_beside_parts(name: str, dora: Iterable[str], parts: Iterable[str], other_dora: Iterable[str],
                             other_parts: Iterable[str]) -> None:
    """Refuse a DoRA on a Linear whose weight an exact part also writes (this adapter's or another's), either way
    round: the part would change the ``W`` DoRA normalises after its norms were measured. Arguments: module paths."""
    dora, parts = set(dora), set(parts)
    clash = sorted((dora & (parts | set(other_parts))) | (parts & set(other_dora)))
    if clash:
        raise H3AppError(f"adapter {name!r}: {clash[0]} would carry a DoRA and an exact part (.diff/.set_weight) at "
                         "once; DoRA normalises the base weight's rows, which the part changes: attach them apart.")
