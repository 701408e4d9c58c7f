"""One backend job run on every rank in step: announced by rank 0 (the job value itself, ``backend.jobs``), queued
by each follower as that same value on its own Backend, the same agreements at the same points, one outcome for all. :class:`Lockstep` is the job wrapper the entry points
inject into the backend when ranks > 1 (``follower.bind``); this package never imports the backend.

The job's code is the single-process code, unchanged, on every rank (the same adapters through the same engine, the
same text encoder, the same steps); the only difference is that ``should_cancel`` becomes an agreement (``step``),
so cancel, and a failure on any rank, stop all ranks at the same step. Whatever happened, every rank then agrees on
the outcome (``finish``): if any rank failed, every rank raises, so each worker resets its adapters to the bitwise
base and the next job starts clean everywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from torch.distributed import DistError

from .context_parallel import parallelize
from .group import PeerFailed, RankGroup
from .rank_backend import RankJob
from .timeouts import RankLost

T = TypeVar("T")


@dataclass(frozen=True)
class Lockstep:
    """The job wrapper of several ranks (a ``backend.jobs.JobWrapper``): rank 0 announces each job, every rank runs
    it in step. ``transformer(workflow)``: the held model's partition for a workflow."""

    group: RankGroup
    transformer: Callable[[str], Any]

    def __call__(self, job: RankJob, sinks: object, here: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``job`` run on every rank together: rank 0 announces the value (picklable: it travels to the followers,
        who queue the same value); ``here`` (a function of a ``JobContext``) runs it on this rank with this rank's
        ``sinks`` (rank 0's board; a follower has none)."""
        group = self.group

        def run(ctx: Any) -> Any:
            group.check_usable()
            if group.leader:
                group.announce(job)
            group.step()  # every rank holds the job
            if group.leader:
                group.forget()

            def body() -> Any:
                parallelize(self.transformer(job.workflow), group.spec)  # a partition loaded late
                return here(dataclasses.replace(ctx, decide_cancel=lambda asked: group.step(cancel=asked)))

            return on_every_rank(group, body)

        return run


def on_every_rank(group: RankGroup | None, work: Callable[[], T]) -> T:
    """Run ``work`` on every rank (SPMD, no job channel) and agree on the outcome: a failure on any rank raises on
    every rank (the failing rank's own error there, :class:`PeerFailed` elsewhere). ``None`` group: just run it."""
    if group is None:
        return work()
    error: BaseException | None = None
    try:
        result = work()  # bound unless ``work`` raised, and then every path below raises
    except BaseException as caught:  # noqa: BLE001 — shared with the other ranks below
        error = caught
    try:
        outcomes = group.finish(error)
    except RankLost as lost:
        raise lost from error
    if isinstance(error, DistError):  # a collective inside the model failed: its process group may be wedged
        raise group.lose(error) from error
    if error is not None and not isinstance(error, PeerFailed):
        raise error  # this rank's own failure: the same line a single process would give
    causes = [(rank, line) for rank, line in enumerate(outcomes)
              if line is not None and not line.startswith(PeerFailed.__name__)]
    if causes:
        rank, line = causes[0]
        raise PeerFailed(f"rank {rank} failed ({line}); every rank stopped and undid the job's adapter "
                         f"changes.") from error
    if error is not None:
        raise error
    return result
