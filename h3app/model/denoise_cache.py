"""The step cache (``--cache fbc``): diffusers' first-block cache on the H3 transformer, for one run at a time.

At every evaluation the first main block runs; when its residual (output − input) moved by less than
:data:`FBC_THRESHOLD` of its size since the last evaluation that ran every block (mean |Δresidual| / mean |residual|
over the whole packed sequence: video, audio and text rows together), the other blocks are skipped and the residual
they added then is added again (diffusers' ``FirstBlockCacheConfig`` / ``apply_first_block_cache``). Everything
around the blocks (embeddings, token refiner, output heads) runs at every evaluation, and so do the per-evaluation
events: a skipped evaluation is still an evaluation (progress, cancel, listeners all hear it).

**LoRA exact.** The cache lives on the blocks, the LoRA wrappers inside them: an evaluation that runs uses the
adapter's delta exactly as without the cache; one that is skipped reuses what the adapter produced at the last run
one. The decision is a pure function of the run's own numbers, so two settings with bit-identical outputs take the
same decisions and stay bit-identical (the equivalence check, tested). A PDD head bank changes the weights at every
evaluation, which a reused residual would not follow: refused (``backend.generation``).

The hooks are put on for one run and taken off after it (:func:`first_block_cache`), so no state leaks from one
request into the next, and a run without the cache is the model as loaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import H3AppError
from ..rules.choices import FIRST_BLOCK_CACHE, NO_CACHE, check_cache

# diffusers' own default (``FirstBlockCacheConfig.threshold``): the one value its documentation gives. Higher skips
# more and drifts further from the uncached video; docs/performance.md has what it does on the trained tiny model.
FBC_THRESHOLD = 0.05
# The share of evaluations the cache skipped at FBC_THRESHOLD, measured on the trained tiny model at 30 steps
# (``python -m bench.step_cache_quality``: two seeds, without LoRA and with each demo adapter; docs/performance.md).
# The plan predicts a cached run from it; bench/gpu.py measures the full model's own.
MEASURED_SKIP_SHARE = 0.448
CACHE_CONTEXT = "h3app"  # the name diffusers keys the cache's state by (one denoising call per evaluation here)


@dataclass
class CacheCount:
    """What the step cache did in one run: ``evaluations`` and which of them skipped the remaining blocks."""

    kind: str = NO_CACHE
    threshold: float | None = None
    decisions: list[bool] = field(default_factory=list)  # per evaluation: True = the remaining blocks ran

    @property
    def evaluations(self) -> int:
        return len(self.decisions)

    @property
    def skipped(self) -> int:
        return sum(1 for ran in self.decisions if not ran)

    def to_json(self) -> dict[str, Any]:
        """``{kind, threshold, evaluations, skipped, skipped_at}`` (the run's JSON and its settings record this;
        ``skipped_at``: the 0-based indices of the evaluations that skipped the remaining blocks)."""
        return {"kind": self.kind, "threshold": self.threshold, "evaluations": self.evaluations,
                "skipped": self.skipped, "skipped_at": [i for i, ran in enumerate(self.decisions) if not ran]}


def cached_blocks(transformer: torch.nn.Module) -> torch.nn.ModuleList:
    """The main blocks the first-block cache works on (the first is the leader, the last carries the residual)."""
    blocks = getattr(transformer, "transformer_blocks", None)
    if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) < 2:
        raise H3AppError("--cache fbc needs a transformer with at least two main blocks (one decides, the rest are "
                         "skipped): this one has fewer; run without --cache.")
    return blocks


@contextmanager
def first_block_cache(transformer: torch.nn.Module, threshold: float = FBC_THRESHOLD) -> Iterator[CacheCount]:
    """diffusers' first-block cache on ``transformer`` for the duration of the block (one run): yields the count,
    filled after every forward of the transformer. The hooks are removed on exit, whatever happened."""
    from diffusers.hooks import FirstBlockCacheConfig
    from diffusers.models import CacheMixin

    from .diffusers_compat import first_block_computed, register_cache_block

    blocks = cached_blocks(transformer)
    if not isinstance(transformer, CacheMixin):
        raise H3AppError(f"--cache fbc needs a diffusers model with a step cache; a {type(transformer).__name__} has "
                         "none: run without --cache.")
    register_cache_block(type(blocks[0]))
    count = CacheCount(FIRST_BLOCK_CACHE, threshold)
    head = blocks[0]

    def decided(module: torch.nn.Module, args: Any, output: Any) -> None:
        count.decisions.append(first_block_computed(head))

    own_forward = [block for block in blocks if "forward" not in vars(block)]
    transformer.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    handle = transformer.register_forward_hook(decided)
    try:
        with transformer.cache_context(CACHE_CONTEXT):
            yield count
    finally:
        handle.remove()
        transformer.disable_cache()
        for block in own_forward:  # diffusers puts the class's forward back as an attribute: the class's again
            vars(block).pop("forward", None)


@contextmanager
def step_cache(transformer: torch.nn.Module, kind: str, threshold: float = FBC_THRESHOLD) -> Iterator[CacheCount]:
    """The step cache ``kind`` names (``none``: nothing is put on; the count stays empty)."""
    if check_cache(kind) == FIRST_BLOCK_CACHE:
        with first_block_cache(transformer, threshold) as count:
            yield count
    else:
        yield CacheCount()
