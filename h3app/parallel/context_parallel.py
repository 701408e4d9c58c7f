"""Shard an H3 transformer's sequence over the ranks with diffusers' context parallel (``enable_parallelism``).

The model's own ``_cp_plan`` gathers the sequence at ``proj_out`` and ``audio_proj_out``; those two are LoRA targets,
and our engine replaces a targeted Linear with a wrapper module, which would leave diffusers' hook on the replaced
module (a local shard plus a gathered base output). So the gather moves one module up, to the output of
``norm_out`` (whose own child ``norm_out.linear`` may be wrapped freely): the two output projections then run on the
whole sequence on every rank, a per-token linear that is a small fraction of one block's work. Weights are not
sharded: every rank holds the whole transformer.
"""

from __future__ import annotations

from typing import Any

from ..errors import H3AppError
from .cpu_shim import one_device_without_accelerator
from .topology import ParallelSpec

MOVED_GATHERS = ("proj_out", "audio_proj_out")
GATHER_AT = "norm_out"
RING_BACKEND = "_native_cudnn"  # returns the log-sum-exp ring attention merges with; native SDPA does not


def is_parallel(transformer: Any) -> bool:
    return getattr(transformer, "_parallel_config", None) is not None


def parallelize(transformer: Any, spec: ParallelSpec) -> None:
    """Make ``transformer``'s forward split its sequence over the ranks (idempotent). Needs torch.distributed
    initialised with ``spec.world_size`` ranks."""
    from diffusers import ContextParallelConfig
    from diffusers.hooks.context_parallel import apply_context_parallel
    from diffusers.models._modeling_parallel import ContextParallelOutput

    if is_parallel(transformer):
        return
    plan = getattr(transformer, "_cp_plan", None)
    if not plan or not all(name in plan for name in MOVED_GATHERS) or GATHER_AT in plan and \
            not isinstance(plan[GATHER_AT], dict):
        raise H3AppError(f"{type(transformer).__name__} has no context-parallel plan this version of h3app knows; "
                         f"run without --ulysses/--ring.")
    if spec.ring > 1:
        transformer.set_attention_backend(RING_BACKEND)
    config = ContextParallelConfig(ulysses_degree=spec.ulysses, ring_degree=spec.ring)
    with one_device_without_accelerator():
        transformer.enable_parallelism(config=config,
                                       cp_plan={k: v for k, v in plan.items() if k not in MOVED_GATHERS})
    apply_context_parallel(transformer, transformer._parallel_config.context_parallel_config,
                           {GATHER_AT: ContextParallelOutput(gather_dim=1, expected_dims=3)})
