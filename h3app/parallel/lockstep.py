"""One backend job run on every rank in step: announced by rank 0, replayed by the followers, the same agreements
at the same points, one outcome for all.

The job's code is the single-process code, unchanged, on every rank (the same adapters through the same engine, the
same text encoder, the same steps); the only difference is that ``should_cancel`` becomes an agreement (``step``),
so cancel, and a failure on any rank, stop all ranks at the same step. Whatever happened, every rank then agrees on
the outcome (``finish``): if any rank failed, every rank raises, so each worker resets its adapters to the bitwise
base and the next job starts clean everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch.distributed import DistError

from ..rules.choices import T2VA
from .context_parallel import parallelize
from .group import PeerFailed, RankGroup
from .timeouts import RankLost


@dataclass(frozen=True)
class JobCall:
    """What a follower needs to replay a job: the Backend method, its arguments, the workflow it runs."""

    method: str
    args: tuple
    workflow: str = T2VA


def lockstep_job(group: RankGroup, backend: Any, call: JobCall, job: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap a worker job (a function of a JobContext) so that it runs on every rank together."""
    from ..backend.worker import JobContext

    @dataclass
    class StepContext(JobContext):
        def should_cancel(self) -> bool:
            return group.step(cancel=JobContext.should_cancel(self))

    def run(ctx: JobContext) -> Any:
        group.check_usable()
        if group.leader:
            group.announce(call)
        group.step()  # every rank holds the job
        if group.leader:
            group.forget()

        def body() -> Any:
            parallelize(backend.model.transformer(call.workflow), group.spec)  # a partition loaded late
            return job(StepContext(ctx.handle))

        return on_every_rank(group, body)

    return run


def on_every_rank(group: RankGroup | None, work: Callable[[], Any]) -> Any:
    """Run ``work`` on every rank (SPMD, no job channel) and agree on the outcome: a failure on any rank raises on
    every rank (the failing rank's own error there, :class:`PeerFailed` elsewhere). ``None`` group: just run it."""
    if group is None:
        return work()
    error: BaseException | None = None
    result = None
    try:
        result = work()
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
