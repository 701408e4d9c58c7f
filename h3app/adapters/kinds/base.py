"""What every adapter kind beyond plain A/B pairs gives the planner: its factor names, the checks on their shapes
from the header alone, and the exact A/B pair its factors make (one module per kind beside this one)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import H3AppError
from ..factor_checks import FLOAT_DTYPES

if TYPE_CHECKING:  # annotations only: inspection never imports torch
    import torch

Shape = tuple[int, ...]


@dataclass(frozen=True)
class KindFacts:
    """One module's factors once checked: ``rank`` is what the scale formula divides alpha by (the rank the
    trainer's loader divides by), ``width`` the rank of the exact A/B pair normalisation builds, ``shape`` the
    ``(out, in)`` the factors make, ``alpha_applies`` False where the kind's own loader ignores alpha."""

    rank: int
    width: int
    shape: tuple[int, int]
    dtype: str
    alpha_applies: bool = True


@dataclass(frozen=True)
class Kind:
    """One adapter kind: ``name`` (``inspect``'s format word), ``label`` (what a person reads), ``factors`` (a regex
    of its factor names, the key's last part before an optional ``.weight``), ``facts`` (the header checks) and
    ``pair`` (the factors, read, made into ``(A [width, in], B [out, width])`` fp32 with ``B @ A`` = its ΔW before
    the scale)."""

    name: str
    label: str
    factors: str
    facts: Callable[[str, str, Mapping[str, tuple[str, Shape]]], KindFacts]
    pair: Callable[[Mapping[str, torch.Tensor], KindFacts], tuple[torch.Tensor, torch.Tensor]]


def require(name: str, stem: str, label: str, factors: Mapping[str, tuple[str, Shape]], *wanted: str) -> None:
    """Refuse a module of kind ``label`` that lacks one of ``wanted`` factors, or holds a non-float or non-2D one."""
    missing = [w for w in wanted if w not in factors]
    if missing:
        raise H3AppError(f"{name}: {label} module {stem!r} has {', '.join(sorted(factors))} but no {missing[0]}: the "
                         "file is incomplete; re-export it.")
    for factor, (dtype, shape) in sorted(factors.items()):
        if dtype not in FLOAT_DTYPES:
            raise H3AppError(f"{name}: {stem}.{factor} is {dtype}: quantised or integer {label} factors are not "
                             "supported; use an F16/BF16/F32 file.")
        if len(shape) != 2 or 0 in shape:
            raise H3AppError(f"{name}: {stem}.{factor} is {list(shape)}: {label} factors of a Linear are 2-D and "
                             "not empty (H3 has no conv layer an adapter can target); the file is not for H3.")


def dtype_of(factors: Mapping[str, tuple[str, Shape]]) -> str:
    dtypes = sorted({dtype for dtype, _ in factors.values()})
    return dtypes[0] if len(dtypes) == 1 else "/".join(dtypes)


def dense_pair(delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An exact pair for a dense ``ΔW [out, in]`` (fp32): ``(I, ΔW)`` or ``(ΔW, I)``, the narrower width."""
    import torch

    out_features, in_features = delta.shape
    if in_features <= out_features:
        return torch.eye(in_features, dtype=torch.float32), delta.float().contiguous()
    return delta.float().contiguous(), torch.eye(out_features, dtype=torch.float32)
