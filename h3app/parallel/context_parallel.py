"""Shard an H3 transformer's sequence over the ranks with diffusers' context parallel (``enable_parallelism``).

The model's own context-parallel plan gathers the sequence at ``proj_out`` and ``audio_proj_out``; those two are
LoRA targets, and our engine replaces a targeted Linear with a wrapper module, which would leave diffusers' hook on
the replaced module (a local shard plus a gathered base output). So the gather moves one module up, to the output of
``norm_out`` (whose own child ``norm_out.linear`` may be wrapped freely): the two output projections then run on the
whole sequence on every rank, a per-token linear that is a small fraction of one block's work. Weights are not
sharded: every rank holds the whole transformer.

Prompts tokenise to any length, so the "anything" sharding modes are on (ranks may hold one row more than others).
diffusers' own uneven gather needs a backend with uneven all-gather (gloo has none), so our gather pads each shard
to the longest, gathers, and trims.

What of this needs diffusers' private API goes through ``h3app.model.diffusers_compat`` (the plan, the mesh's group,
the size gather, the CPU device count). Ring attention runs cuDNN's (``rules.attention.CUDNN``: it returns the
log-sum-exp the ring merges by).
"""

from __future__ import annotations

from typing import Any

from diffusers.hooks import HookRegistry, ModelHook

from ..errors import H3AppError
from ..model import diffusers_compat as private
from ..model.attention import apply as apply_attention
from ..rules.attention import CUDNN
from .topology import ParallelSpec

MOVED_GATHERS = ("proj_out", "audio_proj_out")
GATHER_AT = "norm_out"
GATHER_HOOK = "h3app_cp_gather_rows"


def parallelize(transformer: Any, spec: ParallelSpec) -> None:
    """Make ``transformer``'s forward split its sequence over the ranks (idempotent). Needs torch.distributed
    initialised with ``spec.world_size`` ranks."""
    from diffusers import ContextParallelConfig

    if private.is_parallel(transformer):
        return
    plan = private.context_parallel_plan(transformer)
    if not plan or not all(name in plan for name in MOVED_GATHERS) or GATHER_AT in plan and \
            not isinstance(plan[GATHER_AT], dict):
        raise H3AppError(f"{type(transformer).__name__} has no context-parallel plan this version of h3app knows; "
                         f"run without --ulysses/--ring.")
    if spec.ring > 1:  # on this transformer alone (the VAE's float32 decoder keeps SDPA): model.attention.apply
        apply_attention(transformer, CUDNN)
    # "anything" modes: any sequence length (prompts tokenise to any length) and any head count.
    config = ContextParallelConfig(ulysses_degree=spec.ulysses, ring_degree=spec.ring,
                                   ulysses_anything=spec.ring == 1, ring_anything=spec.ulysses == 1)
    with private.one_device_without_accelerator():
        transformer.enable_parallelism(config=config,
                                       cp_plan={k: v for k, v in plan.items() if k not in MOVED_GATHERS})
    group = private.context_parallel_group(transformer)
    registry = HookRegistry.check_if_exists_or_initialize(getattr(transformer, GATHER_AT))
    registry.register_hook(_GatherRows(group), GATHER_HOOK)


class _GatherRows(ModelHook):
    """After ``norm_out``: every rank's ``[B, rows_r, C]`` shard → the whole ``[B, Σ rows_r, C]`` on every rank."""

    def __init__(self, group: Any) -> None:
        super().__init__()
        self.group = group

    def post_forward(self, module: Any, output: Any) -> Any:
        import torch
        import torch.distributed as dist

        rows = private.gather_sizes(int(output.shape[1]), self.group)
        longest = max(rows)
        padded = torch.nn.functional.pad(output.contiguous(), (0, 0, 0, longest - output.shape[1]))
        shards = [torch.empty_like(padded) for _ in rows]
        dist.all_gather(shards, padded, group=self.group)
        return torch.cat([shard[:, :count] for shard, count in zip(shards, rows)], dim=1)
