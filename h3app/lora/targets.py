"""Where each canonical target lives in a transformer: its own Linear, or one row group of a fused ``to_qkv``.

Canonical targets are the unfused diffusers Linear names (``transformer_blocks.N.attn.to_q`` …). When the transformer
was fused at load time (``attn.to_qkv``, rows blocked ``[q; k; v]``), the three q/k/v targets of a block live on its
``to_qkv`` as row groups 0/1/2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from ..errors import H3AppError
from ..rules.h3_modules import QKV, group_of
from .layers import LoRALinear


@dataclass(frozen=True)
class TargetSlot:
    """Where a canonical target lives: ``module`` (its own Linear, or the fused ``to_qkv``), which row group of that
    module (``index`` of ``groups``), and the target's own ``[out_features, in_features]``."""

    target: str
    module: str
    index: int
    groups: int
    out_features: int
    in_features: int
    group: str

    @property
    def row_span(self) -> tuple[int, int]:
        """``[start, stop)``: this target's rows of its module's weight."""
        return self.index * self.out_features, (self.index + 1) * self.out_features


def discover_targets(transformer: nn.Module) -> dict[str, TargetSlot]:
    """Every LoRA-able Linear of ``transformer`` as canonical target → slot (works on the meta device).

    A fused attention (``fused_projections`` with ``to_qkv``) contributes its three canonical q/k/v targets to
    ``to_qkv``; any split ``to_q/k/v`` left beside it is unused by the fused processor and is skipped.
    """
    fused_attention = {name for name, module in transformer.named_modules() if _is_fused_attention(module)}
    slots: dict[str, TargetSlot] = {}
    for name, linear in _linears(transformer):
        parent, _, attr = name.rpartition(".")
        out_features, in_features = int(linear.out_features), int(linear.in_features)
        if attr == "to_qkv" and parent in fused_attention:
            if out_features % 3:
                raise H3AppError(f"{name} has {out_features} rows, not a multiple of 3: it is not a blocked [q; k; v] projection.")
            for index, qkv in enumerate(QKV):
                target = f"{parent}.{qkv}"
                slots[target] = TargetSlot(target, name, index, 3, out_features // 3, in_features, group_of(target))
        elif not (attr in QKV and parent in fused_attention):
            slots[name] = TargetSlot(name, name, 0, 1, out_features, in_features, group_of(name))
    return slots


def _is_fused_attention(module: nn.Module) -> bool:
    return bool(getattr(module, "fused_projections", False)) and isinstance(
        getattr(module, "to_qkv", None), (nn.Linear, LoRALinear))


def _linears(transformer: nn.Module) -> list[tuple[str, nn.Linear]]:
    """``(path, Linear)`` for every Linear, a ``LoRALinear`` standing for its base (whose own path is skipped)."""
    found: list[tuple[str, nn.Linear]] = []
    wrapped: list[str] = []
    for name, module in transformer.named_modules():
        if any(name.startswith(prefix) for prefix in wrapped):
            continue
        if isinstance(module, LoRALinear):
            wrapped.append(name + ".")
            found.append((name, module.base))
        elif isinstance(module, nn.Linear):
            found.append((name, module))
    return found
