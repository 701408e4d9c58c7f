"""The LoRA delta ``x·Aᵀ·Bᵀ`` for one projection (2D factors) or a stack of projections sharing one input (3D).

A regular projection has ``A [r, in]`` and ``B [out, r]``. A fused projection (``attn.to_qkv``: q, k and v rows
stacked as ``[q; k; v]``) takes one ``A [g, r, in]`` / ``B [g, out_g, r]`` stack per group and returns the groups'
outputs side by side, group-major: ``[..., g * out_g]`` = ``[q-part | k-part | v-part]``.

Internal errors here are ``ValueError`` (the engine validates user input before it gets this far); each message
names the dimension or group that disagrees.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def compute_lora_delta(
    x: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    *,
    scale: float | torch.Tensor | None = None,
    group_scales: torch.Tensor | Sequence[float] | None = None,
    row_scales: torch.Tensor | None = None,
    out_block_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """The LoRA delta of ``x`` (``[..., in]``) through factors ``A`` and ``B``, computed in ``x``'s dtype.

    - 2D: ``A [r, in]``, ``B [out, r]`` → ``[..., out]`` = ``scale · (x Aᵀ) Bᵀ``.
    - 3D: ``A [g, r, in]``, ``B [g, out_g, r]`` → ``[..., g·out_g]``, group-major; group ``i`` is multiplied by
      ``group_scales[i]`` (shape ``[g]``) and everything by ``scale``.

    Per-modality factors (``h3app.lora.rows``): ``row_scales`` (``x.shape[:-1]``, or 0-dim) multiply each input
    row's delta, folded into ``scale`` (one product, then one multiplication of the hidden: a row at factor 1 gets
    bitwise the plain delta, a row at 0 exactly zero); ``out_block_scales`` (``[k]``, 2D only) multiply the ``k``
    equal contiguous blocks of the output features (the AdaLN projection's modality blocks).

    Scales multiply the rank-space hidden ``x Aᵀ`` (``r`` wide), which is cheaper than scaling the output and the
    same up to fp rounding. ``scale`` may be a Python float (applied in the tensor's dtype) or a 0-dim tensor. For a
    half-precision ``x`` a tensor scale is applied in fp32 (the hidden upcast, scaled, rounded once back), so an
    fp32 scale is never first rounded to bf16.
    """
    if A.ndim != B.ndim or A.ndim not in (2, 3):
        raise ValueError(
            f"LoRA factors must both be 2D ([r,in]/[out,r]) or both 3D ([g,r,in]/[g,out_g,r]); "
            f"got A with {A.ndim} dims {tuple(A.shape)} and B with {B.ndim} dims {tuple(B.shape)}"
        )
    if x.shape[-1] != A.shape[-1]:
        raise ValueError(f"input has {x.shape[-1]} features but A {tuple(A.shape)} expects in_features={A.shape[-1]}")
    if A.shape[-2] != B.shape[-1]:
        raise ValueError(f"rank mismatch: A {tuple(A.shape)} has rank {A.shape[-2]} but B {tuple(B.shape)} has rank {B.shape[-1]}")

    if row_scales is not None:
        scale = _row_scale(scale, row_scales)
    if A.ndim == 2:
        if group_scales is not None:
            raise ValueError("group_scales needs stacked 3D factors; use scale= for a 2D delta")
        delta = F.linear(_scaled(F.linear(x, A), scale), B)
        if out_block_scales is not None:
            blocks = out_block_scales.shape[0]
            delta = _scaled(delta.unflatten(-1, (blocks, -1)), out_block_scales.unsqueeze(-1)).flatten(-2)
        return delta
    if out_block_scales is not None:
        raise ValueError("out_block_scales needs 2D factors")

    groups, rank, in_features = A.shape
    if B.shape[0] != groups:
        raise ValueError(f"group count mismatch: A {tuple(A.shape)} has {groups} groups but B {tuple(B.shape)} has {B.shape[0]}")
    hidden = F.linear(x, A.reshape(groups * rank, in_features)).unflatten(-1, (groups, rank))  # [..., g, r]
    if group_scales is not None:
        group_scales = torch.as_tensor(group_scales, device=hidden.device)
        if hidden.dtype in (torch.float32, torch.float64) or not group_scales.dtype.is_floating_point:
            group_scales = group_scales.to(hidden.dtype)
        if group_scales.shape != (groups,):
            raise ValueError(f"group_scales has shape {tuple(group_scales.shape)} but the stack has {groups} groups")
        hidden = _scaled(hidden, group_scales.unsqueeze(-1))
    if isinstance(scale, torch.Tensor) and scale.ndim:
        scale = scale.unsqueeze(-1)  # per-row factors [..., 1] → [..., 1, 1] against the hidden [..., g, r]
    hidden = _scaled(hidden, scale)
    delta = torch.einsum("...gr,gor->...go", hidden, B)  # [..., g, out_g]
    return delta.flatten(-2)


def _row_scale(scale: float | torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
    """``scale · rows`` shaped to multiply a hidden of ``rows.shape + (r,)`` (a 0-dim ``rows`` stays 0-dim)."""
    product = rows if scale is None else rows * scale
    return product.unsqueeze(-1) if product.ndim else product


def _scaled(hidden: torch.Tensor, scale: float | torch.Tensor | None) -> torch.Tensor:
    """``hidden · scale`` in ``hidden``'s dtype; a tensor scale of another dtype is applied in the wider one and the
    product rounded once to ``hidden``'s dtype."""
    if scale is None:
        return hidden
    if not isinstance(scale, torch.Tensor) or scale.dtype == hidden.dtype:
        return hidden * scale
    wide = torch.promote_types(hidden.dtype, scale.dtype)
    return (hidden.to(wide) * scale.to(wide)).to(hidden.dtype)


def stack_group_factors(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor] | None],
    *,
    out_features_per_group: int,
    in_features: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack per-group ``(A [r_i, in], B [out_g, r_i])`` pairs into ``A [g, r_max, in]`` and ``B [g, out_g, r_max]``.

    Groups with ``None`` (e.g. ``to_k`` of a q+v-only adapter) get all-zero factors; smaller ranks are zero-padded
    to the largest. Both are exact: padded rows of A give zero hidden units, and padded columns of B multiply them
    (and zeros) only. Returns tensors in ``dtype`` on ``device``.
    """
    if not pairs or all(pair is None for pair in pairs):
        raise ValueError("a stack needs at least one covered group")
    max_rank = 0
    for index, pair in enumerate(pairs):
        if pair is None:
            continue
        A, B = pair
        if A.ndim != 2 or B.ndim != 2:
            raise ValueError(f"group {index}: factors must be 2D, got A {tuple(A.shape)} and B {tuple(B.shape)}")
        if A.shape[1] != in_features:
            raise ValueError(f"group {index}: A {tuple(A.shape)} has in_features {A.shape[1]}, expected {in_features}")
        if B.shape[0] != out_features_per_group:
            raise ValueError(
                f"group {index}: B {tuple(B.shape)} has out_features {B.shape[0]}, expected {out_features_per_group}"
            )
        if A.shape[0] != B.shape[1]:
            raise ValueError(f"group {index}: rank mismatch, A {tuple(A.shape)} vs B {tuple(B.shape)}")
        max_rank = max(max_rank, int(A.shape[0]))
    groups = len(pairs)
    stacked_A = torch.zeros(groups, max_rank, in_features, dtype=dtype, device=device)
    stacked_B = torch.zeros(groups, out_features_per_group, max_rank, dtype=dtype, device=device)
    for index, pair in enumerate(pairs):
        if pair is None:
            continue
        A, B = pair
        rank = A.shape[0]
        stacked_A[index, :rank].copy_(A)
        stacked_B[index, :, :rank].copy_(B)
    return stacked_A, stacked_B
