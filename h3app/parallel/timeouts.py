"""Bounded collectives: a rank that dies or stops answering fails the job with one line instead of a hang.

Clocks: every in-job collective (the transformer's all-to-all / all-gather and our agreements) waits at most the
spec's ``timeout_s``; a follower waits for the next job without limit, in ``IDLE_WAIT_S`` slices of the store's
wait (a store that vanished means rank 0 ended); a rank started by rank 0 checks every ``POLL_S`` seconds that
rank 0 still lives; the ranks get ``STARTUP_S`` to meet.
"""

from __future__ import annotations

import datetime

from ..errors import H3AppError

POLL_S = 2.0
IDLE_WAIT_S = 600.0
STARTUP_S = 300.0
STOP_WAIT_S = 30.0


def as_timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=float(seconds))


class RankLost(H3AppError):
    """A rank died or stopped answering: the ranks can no longer run jobs together (restart the command)."""


def rank_lost(error: BaseException, who: str, timeout_s: float) -> RankLost:
    """The one line for a failed collective: which rank (when known), what happened, what to do."""
    detail = " ".join(str(error).split())
    if len(detail) > 120:
        detail = detail[:117] + "…"
    return RankLost(f"{who} is gone or was silent for {timeout_s:g} s ({type(error).__name__}: {detail}); the ranks "
                    f"cannot run more jobs together: restart the command (or raise --parallel-timeout if a step "
                    f"legitimately takes longer).")
