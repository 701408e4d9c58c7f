"""A job is a value (``backend/jobs.py``): the ``submit_*`` methods build one, and the very same value is what the
worker runs, what rank 0 announces and a follower rank replays (``parallel.lockstep``, ``parallel.follower``) and what
a ZeroGPU call carries into its child (``backend/gpu_calls.py``, under the fork stand-in). The caller's sinks (the
previews board, ``on_cell``) stay out of it."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from h3app.backend import jobs, zero_gpu
from h3app.backend.jobs import GenerateJob, Job, Run, Sinks
from h3app.backend.preview import PreviewBoard
from h3app.backend.service import Backend
from h3app.parallel import follower, lockstep
from h3app.parallel.group import STOP
from h3app.parallel.lockstep import Lockstep
from h3app.parallel.topology import ParallelSpec
from h3app.request import GenerationRequest
from h3app.settings import LoRASettings

ROOT = Path(__file__).resolve().parents[1]
TURBO = str(ROOT / "assets" / "adapters" / "lightx2v_turbo_no_alpha.safetensors")
REQUEST = GenerationRequest(prompt="a lighthouse at night", seed=3, steps=2)
ADAPTER = LoRASettings(source=TURBO, alpha=8.0)


class Recorded:
    """A job wrapper around another: keeps each job value and its sinks as queued, and each result as run."""

    def __init__(self, inner: Callable[[Job, Sinks, Run], Run] = jobs.alone, run_it: bool = True) -> None:
        self.inner, self.run_it = inner, run_it
        self.queued: list[tuple[Job, Sinks]] = []
        self.results: list[Any] = []

    def __call__(self, job: Job, sinks: Sinks, here: Run) -> Run:
        self.queued.append((job, sinks))
        run = self.inner(job, sinks, here)

        def recorded(ctx: Any) -> Any:
            result = run(ctx) if self.run_it else None
            self.results.append(result)
            return result

        return recorded


class OneProcessRanks:
    """``RankGroup`` for two ranks in one process: what rank 0 announces is kept as the bytes the store would hold,
    and the follower receives those bytes; every agreement says "go on" and every rank succeeded."""

    def __init__(self, rank: int, channel: list[bytes]) -> None:
        self.rank, self.channel, self.spec = rank, channel, ParallelSpec(ulysses=2)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def check_usable(self) -> None:
        return None

    def announce(self, job: Any) -> None:
        self.channel.append(pickle.dumps(job))

    def receive(self) -> Any:
        return pickle.loads(self.channel.pop(0)) if self.channel else STOP

    def step(self, cancel: bool = False) -> bool:
        return False

    def forget(self) -> None:
        return None

    def finish(self, error: BaseException | None) -> list[str | None]:
        return [None if error is None else str(error), None]


@pytest.fixture
def backends(tiny_model, tmp_path, monkeypatch):
    """Two in-process Backends on the session's tiny model (they take turns: each is reset after its job)."""
    monkeypatch.delenv(zero_gpu.ZERO_GPU_ENV, raising=False)
    monkeypatch.delenv(zero_gpu.FORK_ENV, raising=False)
    made = [Backend(loaded=tiny_model, output_dir=tmp_path / name) for name in ("one", "two")]
    yield made
    for backend in made:
        backend.binder.reset()
        backend.close()


def test_each_submit_queues_one_job_value_that_travels_whole_and_leaves_the_sinks_here(backends):
    backend, _ = backends
    backend.wrap_job = recorded = Recorded(run_it=False)
    board, cells = PreviewBoard(), []
    plan = backend.plan_grid([8.0], [0.5, 1.0], [0])
    expected = [
        (backend.submit_load(ADAPTER), jobs.LoadJob(ADAPTER)),
        (backend.submit_generate(REQUEST, [ADAPTER], "hf_x", previews=board), GenerateJob(REQUEST, (ADAPTER,), "hf_x")),
        (backend.submit_equivalence(REQUEST, ADAPTER, previews=board), jobs.EquivalenceJob(REQUEST, ADAPTER)),
        (backend.submit(jobs.CheckRunJob(jobs.EquivalenceJob(REQUEST, ADAPTER, low_rank_only=True), "B")),
         jobs.CheckRunJob(jobs.EquivalenceJob(REQUEST, ADAPTER, low_rank_only=True), "B")),
        (backend.submit_grid(REQUEST, ADAPTER, plan, on_cell=cells.append, previews=board),
         jobs.GridJob(REQUEST, ADAPTER, plan)),
        (backend.submit(jobs.GridBaselineJob(REQUEST, 3)), jobs.GridBaselineJob(REQUEST, 3)),
    ]
    for handle, _ in expected:
        backend.run(handle)
    assert [job for job, _ in recorded.queued] == [job for _, job in expected]
    assert [handle.label for handle, _ in expected] == \
        [f"load {TURBO}", "generate", "equivalence", "equivalence B", "grid", "grid baseline"]
    for job, _ in recorded.queued:
        assert pickle.loads(pickle.dumps(job)) == job  # what ranks and ZeroGPU calls send arrives whole
        assert job.workflow == REQUEST.workflow
    assert recorded.queued[1][0].token == "hf_x" and "hf_x" not in repr(recorded.queued[1][0])  # kept, never logged
    assert [sinks for _, sinks in recorded.queued][1:5] == \
        [Sinks(board), Sinks(board), Sinks(), Sinks(board, cells.append)]
    with pytest.raises(TypeError):
        pickle.dumps(board)  # the caller's board could not travel: it is never in a job


@pytest.mark.slow
def test_the_worker_the_ranks_and_a_zero_gpu_call_run_the_same_job_value_to_the_same_hash(
        backends, tiny_model, tmp_path, monkeypatch):
    """One ``GenerateJob``: queued on one Backend; announced by a lockstep rank 0 and replayed by a follower from
    the announced bytes; carried by a forked ZeroGPU call. One value, one hash."""
    job = GenerateJob(REQUEST, (ADAPTER,))
    alone, _ = backends
    expected = alone.run(alone.submit(job)).result.hash
    alone.binder.reset()

    leader, follower_backend = backends
    monkeypatch.setattr(lockstep, "parallelize", lambda transformer, spec: None)  # one process: nothing to shard
    channel: list[bytes] = []
    leader.wrap_job = Lockstep(OneProcessRanks(0, channel), leader.model.transformer)  # type: ignore[arg-type]
    assert leader.run(leader.submit(job)).result.hash == expected
    leader.binder.reset()
    assert [pickle.loads(message) for message in channel] == [job]
    follower_group = OneProcessRanks(1, channel)
    follower_backend.wrap_job = replayed = Recorded(Lockstep(follower_group, follower_backend.model.transformer))  # type: ignore[arg-type]
    assert follower.follow(follower_group, follower_backend) == 0  # type: ignore[arg-type]
    assert [queued for queued, _ in replayed.queued] == [job] and replayed.results[0].result.hash == expected
    follower_backend.binder.reset()

    monkeypatch.setenv(zero_gpu.FORK_ENV, "1")
    forked = Backend(loaded=tiny_model, output_dir=tmp_path / "forked")
    forked.time_model = lambda request: {"video_s": 4.0, "step_s": 1.0, "evaluations": 2}
    calls = forked.wrap_job
    original, carried = calls.call, []
    calls.call = lambda payload: (carried.append(pickle.loads(pickle.dumps(payload))), original(payload))[1]
    try:
        assert forked.run(forked.submit(job)).result.hash == expected
    finally:
        forked.close()
    assert [payload.job for payload in carried] == [job]
