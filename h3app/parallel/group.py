"""The ranks of one command: a job channel from rank 0 to the others, and the agreements that keep them in step.

Jobs travel through ``torch.distributed``'s key-value store (rank 0 writes ``h3app/job/N``; a follower waits for it
in ``IDLE_WAIT_S`` slices, so an idle app waits for days without a collective timing out). Inside a job every rank calls
the same agreements, one small ``all_reduce`` over a gloo group of ``[cancel, failed, finished]`` counts:

- ``step`` before every transformer evaluation: rank 0 contributes its cancel flag, so all ranks stop at the same
  step; a rank that already left the job (it failed) makes the others leave too.
- ``finish`` when a rank leaves the job (done or failed): repeated until every rank has finished, then each rank's
  outcome (None or its one-line error) is gathered, so every rank knows whether the job failed anywhere.
"""

from __future__ import annotations

import pickle
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import H3AppError
from .timeouts import IDLE_WAIT_S, STOP_WAIT_S, RankLost, as_timedelta, rank_lost
from .topology import ParallelSpec

JOB_KEY = "h3app/job/{}"
STOP = "stop"


class PeerFailed(H3AppError):
    """Another rank failed this job: this rank stopped too (and went back to the base weights)."""


@dataclass(frozen=True)
class Spawned:
    """A rank this process started: its process and the file its stderr goes to."""

    rank: int
    process: subprocess.Popen
    log: Path


@dataclass
class RankGroup:
    """This process's place among the ranks. ``rank`` 0 leads (serves, announces jobs); the others follow."""

    spec: ParallelSpec
    rank: int
    device: str = "cpu"
    spawned: list[Spawned] = field(default_factory=list)
    outcomes: list[str | None] = field(default_factory=list)  # per rank, after each job: None or the error line
    _jobs: int = 0
    _lost: RankLost | None = None
    _sync: Any = None

    def __post_init__(self) -> None:
        import torch.distributed as dist

        # Agreements and outcome exchange stay on CPU (gloo) whatever the tensor backend is (nccl on GPUs).
        self._sync = dist.new_group(backend="gloo", timeout=as_timedelta(self.spec.timeout_s))

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    @property
    def leader(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------------------------------- job channel
    def announce(self, call: Any) -> None:
        """Rank 0: publish the next job (anything picklable) to the followers."""
        self._store().set(JOB_KEY.format(self._jobs), pickle.dumps(call))
        self._jobs += 1

    def receive(self) -> Any:
        """A follower: wait (without limit) for the next job; :data:`STOP` when the leader closes."""
        import torch.distributed as dist

        key = JOB_KEY.format(self._jobs)
        store = self._store()
        while True:
            try:
                store.wait([key], as_timedelta(IDLE_WAIT_S))
                break
            except dist.DistStoreError as error:
                if "timeout" not in str(error).lower():  # the store itself is gone: the leader ended
                    raise rank_lost(error, "rank 0", IDLE_WAIT_S) from error
        call = pickle.loads(store.get(key))
        self._jobs += 1
        return call

    def forget(self) -> None:
        """Rank 0, once every rank holds the current job: drop it from the store."""
        self._store().delete_key(JOB_KEY.format(self._jobs - 1))

    def _store(self) -> Any:
        from ..model.torch_compat import default_store

        return default_store()

    # ------------------------------------------------------------------------------------------- agreements
    def check_usable(self) -> None:
        if self._lost is not None:
            raise self._lost

    def step(self, cancel: bool = False) -> bool:
        """Every rank, before each transformer evaluation: True when rank 0 asked to cancel. Raises
        :class:`PeerFailed` when another rank has left the job."""
        cancelled, failed, finished = self._all_reduce([int(cancel) if self.leader else 0, 0, 0])
        if failed or finished:
            raise PeerFailed("another rank failed this job; every rank stopped at the same step.")
        return bool(cancelled)

    def finish(self, error: BaseException | None) -> list[str | None]:
        """Every rank, leaving a job: wait until all ranks have left, then return each rank's outcome."""
        while True:
            _, _, finished = self._all_reduce([0, int(error is not None), 1])
            if finished == self.world_size:
                break
        self.outcomes = self.gather(None if error is None else f"{type(error).__name__}: {error}")
        return self.outcomes

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order, on every rank."""
        import torch.distributed as dist

        values: list[Any] = [None] * self.world_size
        self._collective(lambda: dist.all_gather_object(values, value, group=self._sync))
        return values

    def _all_reduce(self, values: list[int]) -> list[int]:
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.int64)
        self._collective(lambda: dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self._sync))
        return [int(v) for v in tensor.tolist()]

    def _collective(self, run: Any) -> None:
        self.check_usable()
        try:
            run()
        except (RuntimeError, ValueError) as error:  # gloo/nccl report a dead or silent peer as RuntimeError
            raise self.lose(error) from error

    def lose(self, error: BaseException) -> RankLost:
        """Mark the ranks as unable to continue after ``error`` (a failed collective inside the model)."""
        if self._lost is None:
            self._lost = rank_lost(error, self.describe_lost(), self.spec.timeout_s)
        return self._lost

    def describe_lost(self) -> str:
        """Which rank is gone, when this process started it (its exit code and log file); else a general name."""
        for child in self.spawned:
            code = child.process.poll()
            if code is not None:
                return f"rank {child.rank} (exited with code {code}; its log: {child.log})"
        return "a rank" if self.leader else "rank 0 or another rank"

    # ------------------------------------------------------------------------------------------------ close
    def close(self) -> None:
        """Rank 0: tell the followers to stop and wait for the ranks it started; every rank: leave the group."""
        import torch.distributed as dist

        if self.leader and self._lost is None:
            self.announce(STOP)
        for child in self.spawned:
            try:
                child.process.wait(STOP_WAIT_S if self._lost is None else 0)
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
        if dist.is_initialized() and self._lost is None:  # a wedged group could block its own teardown
            dist.destroy_process_group()
