"""The checks on one module's factor shapes and dtypes, from the header alone, and what they establish."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..errors import H3AppError
from ..rules.module_rules import FUSED_QKV, SWIGLU_GATE_UP, Alternative
from .layouts import BLOCKED, INTERLEAVED, layout_of  # noqa: F401 — BLOCKED/INTERLEAVED re-exported
from .layouts import qkv_order as layout_qkv_order
from .types import HeaderView

FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")


class StemFacts(Protocol):
    """What the checks read of one module's keys (``formats._Stem``)."""

    stem: str
    down: str | None
    up: str | None
    alpha: str | None
    slots: frozenset[str]
    styles: frozenset[str]
    factors: dict[str, str]  # another kind's factors (``kinds/``): factor name → key
    magnitude: str | None  # DoRA's magnitude key


@dataclass(frozen=True)
class FactorFacts:
    """What a module's factors say once checked: its format, rank, its targets' ``(out, in)`` shapes, the row order
    of a fused QKV, the dtype and the suffix style."""

    format: str
    stacked: bool
    rank: int
    target_shapes: tuple[tuple[int, int], ...]
    qkv_order: str
    dtype: str
    suffix_style: str


def check_alpha(view: HeaderView, alpha_key: str) -> None:
    """Refuse an alpha key whose tensor is not a scalar the header can give."""
    if alpha_key not in view.scalars:
        alpha_dtype, alpha_shape = view.tensors[alpha_key]
        raise H3AppError(
            f"{view.name}: {alpha_key!r} is {alpha_dtype} {list(alpha_shape)}, not a readable scalar alpha: "
            "re-export the file."
        )


def check_factors(
    view: HeaderView, entry: StemFacts, alternative: Alternative, matched_flat: bool, qkv_layout: str,
    down: tuple[str, tuple[int, ...]], up: tuple[str, tuple[int, ...]],
) -> FactorFacts:
    """Check one module's factors (and its alpha scalar, in between, where the order of messages puts it)."""
    name = view.name
    rule = alternative.rule
    if len(entry.styles) > 1:
        raise H3AppError(f"{name}: module {entry.stem!r} mixes lora_A/B and lora_down/up keys: the file is damaged; re-export it.")
    (down_dtype, down_shape), (up_dtype, up_shape) = down, up
    for key, dtype in ((entry.down, down_dtype), (entry.up, up_dtype)):
        if dtype not in FLOAT_DTYPES:
            raise H3AppError(
                f"{name}: {key!r} is {dtype}: quantised or integer LoRA factors are not supported; use an F16/BF16/F32 file."
            )
    layout = layout_of(matched_flat, alternative.family, bool(entry.slots))
    stacked = len(down_shape) == 3 or len(up_shape) == 3
    if len(down_shape) not in (2, 3) or len(up_shape) not in (2, 3) or len(down_shape) != len(up_shape):
        raise H3AppError(
            f"{name}: module {entry.stem!r} has lora_A {list(down_shape)} and lora_B {list(up_shape)}: expected 2D "
            "[rank, in] / [out, rank] (or 3D stacks [3, rank, in] / [3, out, rank] for a fused QKV)."
        )
    if stacked:
        if rule.layout != FUSED_QKV:
            raise H3AppError(
                f"{name}: module {entry.stem!r} has 3D (stacked) factors, which only a fused QKV module may have."
            )
        if down_shape[0] != 3 or up_shape[0] != 3:
            raise H3AppError(
                f"{name}: module {entry.stem!r} stacks {down_shape[0]} lora_A and {up_shape[0]} lora_B groups; a fused "
                "QKV needs exactly 3 of each (q, k, v)."
            )
        down_rank, in_features = down_shape[1], down_shape[2]
        up_rank, out_rows = up_shape[2], up_shape[1]
    else:
        down_rank, in_features = down_shape
        out_rows, up_rank = up_shape
    if down_rank != up_rank:
        raise H3AppError(
            f"{name}: module {entry.stem!r} has lora_A rank {down_rank} but lora_B rank {up_rank} (lora_A "
            f"{list(down_shape)}, lora_B {list(up_shape)}): the factors do not belong together; re-export the file."
        )
    if down_rank == 0:
        raise H3AppError(f"{name}: module {entry.stem!r} has rank 0: the file is damaged; re-export it.")
    if entry.alpha is not None:
        check_alpha(view, entry.alpha)

    qkv_order = ""
    shapes: tuple[tuple[int, int], ...]
    if rule.layout == FUSED_QKV:
        if stacked:
            qkv_order = BLOCKED
            shapes = ((out_rows, in_features),) * 3
        else:
            if out_rows % 3:
                raise H3AppError(
                    f"{name}: fused QKV module {entry.stem!r} has {out_rows} lora_B rows, not divisible by 3: it is not "
                    "an H3 QKV projection."
                )
            qkv_order = layout_qkv_order(layout, qkv_layout)
            shapes = ((out_rows // 3, in_features),) * 3
    elif rule.layout == SWIGLU_GATE_UP:
        if out_rows % 2:
            raise H3AppError(
                f"{name}: SwiGLU module {entry.stem!r} has {out_rows} lora_B rows, not even: it is not an H3 fc1."
            )
        shapes = ((out_rows, in_features),)
    else:
        shapes = ((out_rows, in_features),)
    (style,) = entry.styles
    return FactorFacts(
        format=layout.name, stacked=stacked, rank=int(down_rank), target_shapes=shapes, qkv_order=qkv_order,
        dtype=down_dtype if down_dtype == up_dtype else "/".join(sorted((down_dtype, up_dtype))), suffix_style=style,
    )

