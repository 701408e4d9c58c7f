"""Every rank's view of its weights: proof that all ranks hold the same transformer (the base after a failure)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import H3AppError
from ..rules.choices import T2VA
from .lockstep import Lockstep
from .rank_backend import RankBackend


def state_digest(module: Any) -> str:
    """sha256 over names, shapes, dtypes and bytes of ``module``'s state dict (attached LoRA factors included)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        data = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(data.shape)}:{data.dtype}".encode())
        digest.update(data.view(-1).view(dtype=torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class WeightsDigests:
    """A job (a ``backend.jobs.Job``) on every rank: each rank's :func:`state_digest` of ``workflow``'s
    transformer, gathered in rank order."""

    workflow: str = T2VA
    label = "weights digest"

    def run(self, ctx: Any, backend: RankBackend, sinks: Any = None) -> list[str]:
        lockstep = backend.wrap_job
        assert isinstance(lockstep, Lockstep)  # queued only by weights_digests, which checks it
        return lockstep.group.gather(state_digest(backend.model.transformer(self.workflow)))


def weights_digests(backend: RankBackend, workflow: str = T2VA) -> list[str]:
    """One job on every rank of a Backend bound to its ranks (``follower.bind``): each rank's :func:`state_digest`
    of ``workflow``'s transformer, in rank order."""
    if not isinstance(backend.wrap_job, Lockstep):
        raise H3AppError("weights digests compare ranks: bind the Backend to its ranks first (parallel.follower.bind).")
    return backend.run(backend.submit(WeightsDigests(workflow)))
