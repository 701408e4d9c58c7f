"""The one door to torch's private API, for torch 2.14.1 (refused at import on any other release; a CUDA or CPU
build of it, ``2.14.1+cu130``, is the same release).

h3app uses torch's public API everywhere else. What only a private name does:

- fake tensors (``torch._subclasses.fake_tensor``) and pytrees (``torch.utils._pytree``): the full-size rehearsal
  and the fake GPU box run the real model on a fake CUDA device (h3app/hardware/);
- ATen's internal operators a dispatch mode sees (``aten._to_copy`` for every ``.to()``, ``_local_scalar_dense``
  for ``.item()``, the fused attention kernels a GPU runs, ``_convolution``), an operator's schema
  (``func._schema``) and the ``Tensor.data`` setter (``torch._C.TensorBase.data``);
- dynamo's counters (``torch._dynamo.utils``): graphs built and recompiles, for ``--compile``'s report; and
  ``torch._dynamo.maybe_mark_dynamic`` (documented by torch, in a private module): one size of a graph input left
  symbolic where the code allows, so ``--compile`` builds one graph for every count of distinct timesteps;
- the default process group's store (``distributed_c10d._get_default_store``): the ranks' job channel.
"""

from __future__ import annotations

from typing import Any

from ..rules.versions import check_written_for

WRITTEN_FOR = "2.14.1"
check_written_for("torch", WRITTEN_FOR, __name__)

import torch  # noqa: E402 - after the version check, which needs no torch
from torch._subclasses.fake_tensor import (  # noqa: E402
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    fake_tensor_tls,
    unset_fake_temporarily,
)
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten  # noqa: E402

__all__ = [
    "CONVOLUTION_OPS", "DataDependentOutputException", "DynamicOutputShapeException", "EFFICIENT_ATTENTION",
    "FLASH_ATTENTION", "FakeTensor", "FakeTensorMode", "LOCAL_SCALAR_DENSE", "TENSOR_DATA", "TO_COPY",
    "default_store", "dynamo_counters", "fake_tensor_tls", "mark_dynamic", "op_arguments", "tree_flatten", "tree_map",
    "tree_unflatten", "unset_fake_temporarily",
]

_aten = torch.ops.aten
TO_COPY = _aten._to_copy.default  # every .to(): dtype and device changes
LOCAL_SCALAR_DENSE = _aten._local_scalar_dense.default  # .item()
FLASH_ATTENTION = _aten._scaled_dot_product_flash_attention  # what SDPA runs on a GPU: flash attention …
EFFICIENT_ATTENTION = _aten._scaled_dot_product_efficient_attention  # … or memory-efficient attention
CONVOLUTION_OPS = {_aten.convolution, _aten._convolution}  # the public convolution and the one it calls
TENSOR_DATA = torch._C.TensorBase.data  # the descriptor whose __set__ is ``tensor.data = other``


def op_arguments(func: Any) -> list[Any]:
    """The schema's arguments of ATen operator ``func`` (each with ``alias_info``: which ones it writes)."""
    return list(func._schema.arguments)


def dynamo_counters() -> tuple[Any, Any]:
    """dynamo's ``(counters, guard_failures)`` (imported on first use: dynamo takes seconds to import)."""
    from torch._dynamo.utils import counters, guard_failures

    return counters, guard_failures


def mark_dynamic(tensor: Any, dim: int) -> None:
    """Compile graphs that take ``tensor`` with any size ``dim`` (≥ 2: dynamo always specialises sizes 0 and 1) where
    the traced code does not need the number; where it does, the graph is specialised instead (no error)."""
    from torch._dynamo import maybe_mark_dynamic

    maybe_mark_dynamic(tensor, dim)


def default_store() -> Any:
    """The key-value store of the default process group (``torch.distributed`` initialised)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()
