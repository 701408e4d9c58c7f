"""ZeroGPU: a grid over one call's cap split into calls that each fit (``backend/grid_calls.py``), under the fork
stand-in (``H3APP_ZEROGPU_FORK=1``): a seed's baseline as a call of its own when a cell and the baseline do not fit
one call together, grids of several adapter rows split the same way, cells bit for bit the in-process grid's."""

from pathlib import Path
from typing import Any

import pytest

from h3app.backend import grid_calls, zero_gpu, zero_gpu_fork
from h3app.backend.generation import GenerationRequest
from h3app.backend.grid import GridPlan
from h3app.backend.grid_rows import GridRow
from h3app.backend.jobs import GridBaseline, GridBaselineJob, GridJob
from h3app.backend.service import Backend
from h3app.backend.worker import Cancelled, JobContext, JobHandle
from h3app.settings import LoRASettings

ROOT = Path(__file__).resolve().parents[1]
TURBO = str(ROOT / "assets" / "adapters" / "lightx2v_turbo_no_alpha.safetensors")
STYLE = str(ROOT / "assets" / "adapters" / "tiny_style_warm.safetensors")
FIELDS = ("row", "column", "adapter_row", "label", "alpha", "strength", "seed", "hash", "baseline_psnr",
          "baseline_max_abs_diff", "baseline_hash")


def flat_prediction(video_s: float, step_s: float = 2.0, evaluations: int = 19) -> Any:
    """One prediction for any request (the backend's time model is injected; the real one: tests/test_hardware_*)."""
    return lambda request: {"video_s": video_s, "step_s": step_s, "evaluations": evaluations,
                            "check_s": 3 * video_s + step_s}


def grid_cells(backend: Backend, adapter: Any, plan: Any, request: GenerationRequest, **kwargs: Any) -> list[Any]:
    return list(backend.grid(request, adapter, plan, **kwargs))


@pytest.fixture
def two_homes(tiny_model, tmp_path, monkeypatch):
    """The in-process Backend, then (FORK_ENV set) a forked one; both on the tiny model."""
    monkeypatch.delenv(zero_gpu.ZERO_GPU_ENV, raising=False)
    monkeypatch.delenv(zero_gpu.FORK_ENV, raising=False)
    in_process = Backend(loaded=tiny_model, output_dir=tmp_path / "in-process")
    monkeypatch.setenv(zero_gpu.FORK_ENV, "1")
    forked = Backend(loaded=tiny_model, output_dir=tmp_path / "forked")
    yield in_process, forked
    in_process.binder.reset()
    in_process.close()
    forked.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_grid_whose_cell_and_baseline_do_not_fit_runs_its_baseline_as_its_own_call(two_homes):
    """Runs of 60 s: one fits a call's 104 s of work, a cell and its baseline (120 s) do not. Each seed's baseline is
    its own call (20 + 1.25 × 60 = 95 s), each cell another, and the cells are the in-process grid's bit for bit;
    progress counts the whole grid; every cell says the grid ran as 6 calls and the quota they asked for."""
    in_process, forked = two_homes
    adapter, request = LoRASettings(source=TURBO), GenerationRequest(prompt="grid", steps=2)
    plan = in_process.plan_grid([8.0], [0.5, 1.0], [0, 3])
    expected = [tuple(getattr(c, k) for k in FIELDS) for c in grid_cells(in_process, adapter, plan, request)]
    forked.time_model = flat_prediction(video_s=60.0)
    asked, steps = len(zero_gpu_fork.asked), []
    cells = grid_cells(forked, adapter, plan, request, on_step=lambda d, t: steps.append((d, t)))
    assert [tuple(getattr(c, k) for k in FIELDS) for c in cells] == expected
    assert zero_gpu_fork.asked[asked:] == [95] * 6
    assert steps[-1] == (6, 6)  # two baselines and four cells, one evaluation each
    calls = cells[0].zerogpu
    assert calls is not None and calls["calls"] == 6 and calls["runs"][:2] == ["baseline seed 0", "row 0, columns 0-0, seed 0"]
    assert calls["quota_s"] == 6 * zero_gpu.declared(60.0).quota_s and cells[0].to_json()["zerogpu"] == calls
    assert "zerogpu" not in grid_cells(in_process, adapter, plan, request)[0].to_json()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_grid_of_adapter_rows_over_the_cap_splits_per_row_with_the_in_process_cells(two_homes):
    """Two adapter rows × two strengths: four cells and a baseline of 40 s are over one call; a row's cell and the
    baseline fit (20 + 1.25 × 80 = 120 s), so four calls, each cell its own row's adapter, labels and rows kept."""
    in_process, forked = two_homes
    rows = [GridRow(LoRASettings(source=STYLE), "style"), GridRow(LoRASettings(source=TURBO), "turbo")]
    request = GenerationRequest(prompt="grid", steps=2)
    plan = in_process.plan_grid([None], [0.5, 1.0], [0], adapters=2)
    expected = [tuple(getattr(c, k) for k in FIELDS) for c in grid_cells(in_process, rows, plan, request)]
    assert len({row[FIELDS.index("hash")] for row in expected}) == 4  # each row's adapter moved its cells
    forked.time_model = flat_prediction(video_s=40.0)
    asked = len(zero_gpu_fork.asked)
    cells = grid_cells(forked, rows, plan, request)
    assert [tuple(getattr(c, k) for k in FIELDS) for c in cells] == expected
    assert zero_gpu_fork.asked[asked:] == [120] * 4 and cells[-1].zerogpu["calls"] == 4  # type: ignore[index]
    forked.time_model = flat_prediction(video_s=60.0)  # and with each seed's baseline its own call
    assert [tuple(getattr(c, k) for k in FIELDS) for c in grid_cells(forked, rows, plan, request)] == expected


def test_a_split_grid_stops_between_calls_when_cancelled():
    """``grid_calls.run``: a cancel seen after the baseline's call starts no cell's call and says where it stopped."""
    handle = JobHandle(id=1, label="grid", run=lambda ctx: None)
    request = GenerationRequest(prompt="grid", steps=2)
    duration = zero_gpu.declared(60.0)
    base = GridBaselineJob(request, 0)
    plan = GridPlan((8.0,), (0.5,), (0,), None)
    cell = GridJob(request, LoRASettings(source=TURBO), plan, baseline_apart=True)
    parts = [grid_calls.Chunk(base, duration, 0, 0, 1), grid_calls.Chunk(cell, duration, 0, 0, 1, seed=0)]
    made: list[str] = []

    def one_call(part: Any, whole: Any, on_cell: Any) -> Any:
        made.append(type(part.job).__name__)
        whole.on_step(1, 1)
        handle.cancel()
        return GridBaseline(0, None)

    with pytest.raises(Cancelled, match="cancelled after 1 of 2 steps"):
        grid_calls.run(parts, JobContext(handle), one_call, None)
    assert made == ["GridBaselineJob"]
