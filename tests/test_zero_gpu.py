"""ZeroGPU: the door (``backend/zero_gpu.py``), the fork stand-in (``H3APP_ZEROGPU_FORK=1``) and self-contained calls.

Under the stand-in every job runs in a freshly forked child with pickled arguments, as a ZeroGPU Space runs a
``@spaces.GPU`` call: hashes equal the in-process path's, a change a call makes to the model is gone in the next,
progress, previews and grid cells stream out, and Cancel ends the child. Nothing here runs on real ZeroGPU.
"""

import contextvars
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from h3app.backend import zero_gpu, zero_gpu_fork
from h3app.backend.generation import GenerationRequest, run_generation
from h3app.backend.preview import PreviewBoard
from h3app.backend.service import Backend
from h3app.backend.worker import Cancelled, JobContext
from h3app.errors import H3AppError
from h3app.hardware.zero_gpu_home import COMPILE_REFUSED, home_for
from h3app.lora.layers import LoRALinear
from h3app.rules.choices import T2VA
from h3app.settings import LoRASettings
from h3app.ui.presenters.render import verdict_html

ROOT = Path(__file__).resolve().parents[1]
TURBO = str(ROOT / "assets" / "adapters" / "lightx2v_turbo_no_alpha.safetensors")
VISITOR: contextvars.ContextVar[str] = contextvars.ContextVar("visitor", default="nobody")


def flat_prediction(video_s: float = 4.0, step_s: float = 1.0, evaluations: int = 2) -> Any:
    """A time model with one prediction for any request (the backend's time model is injected; the real one is
    tested in tests/test_hardware_*.py)."""
    return lambda request: {"video_s": video_s, "step_s": step_s, "evaluations": evaluations,
                            "check_s": 3 * video_s + step_s}


@pytest.fixture
def forked_backend(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv(zero_gpu.FORK_ENV, "1")
    monkeypatch.delenv(zero_gpu.ZERO_GPU_ENV, raising=False)
    backend = Backend(loaded=tiny_model, output_dir=tmp_path / "forked")
    backend.time_model = flat_prediction()
    yield backend
    backend.close()


@pytest.fixture
def in_process(tiny_model, tmp_path, monkeypatch):
    monkeypatch.delenv(zero_gpu.FORK_ENV, raising=False)
    monkeypatch.delenv(zero_gpu.ZERO_GPU_ENV, raising=False)
    backend = Backend(loaded=tiny_model, output_dir=tmp_path / "in-process")
    yield backend
    backend.binder.reset()
    backend.close()


def test_without_zero_gpu_the_decorator_is_the_function_and_no_job_is_wrapped(in_process, monkeypatch):
    import spaces

    def work(x: int) -> int:
        return x + 1

    assert spaces.GPU(work, duration=10, size="xlarge") is work  # spaces' own rule without SPACES_ZERO_GPU
    assert zero_gpu.gpu(work, lambda x: 10) is work
    assert in_process.wrap_job.__name__ == "alone"
    monkeypatch.setenv(zero_gpu.FORK_ENV, "1")
    assert zero_gpu.gpu(work, lambda x: 10) is not work


@pytest.mark.slow
def test_forked_generate_hash_equals_in_process_and_reports_its_duration(forked_backend, in_process):
    request = GenerationRequest(prompt="a lighthouse at night", seed=3, steps=3)
    adapters = [LoRASettings(source=TURBO, alpha=8.0)]
    expected = in_process.generate(request, adapters)
    in_process.binder.reset()  # the two backends share the session's model: the parent must be at its base
    steps: list[tuple[int, int]] = []
    board = PreviewBoard()
    forked = forked_backend.generate(request, adapters, on_step=lambda d, t: steps.append((d, t)), previews=board)
    assert forked.result.hash == expected.result.hash
    zerogpu = forked.to_json()["zerogpu"]
    assert zerogpu["duration_s"] == zero_gpu.declared(4.0).duration_s == 25  # 20 s start + 1.25 × 4 s
    assert zerogpu["size"] == "xlarge" and zerogpu["quota_s"] == 50 and zerogpu["mode"] == "fork"
    assert zero_gpu_fork.asked[-1] == 25
    assert steps[-1] == (2, 2)  # progress streamed out of the child (3 steps = 2 evaluations)
    assert [p.step for p in board.history()] == [1, 2]  # so were the previews
    assert "zerogpu" not in expected.to_json()


@pytest.mark.slow
def test_a_change_made_inside_one_call_is_gone_in_the_next(forked_backend, in_process, tiny_model):
    """A load attaches the adapter in its call's child; the next call's child is a fresh fork of the parent, where
    nothing is attached: a job that relied on the load (generate without naming the adapter) gets the base, and
    the job that names it gets the adapter's output."""
    request = GenerationRequest(prompt="p", seed=1, steps=2)
    adapter = LoRASettings(source=TURBO, alpha=64.0)
    base = in_process.generate(request).result.hash
    with_adapter = in_process.generate(request, [adapter]).result.hash
    assert base != with_adapter
    in_process.binder.reset()
    loaded = forked_backend.load(adapter)
    assert loaded.report.ok and loaded.report.profile is not None  # measured in the call, travelled as a value
    assert forked_backend.generate(request).result.hash == base
    merged = LoRASettings(source=TURBO, alpha=64.0, mode="merged")
    assert forked_backend.generate(request, [merged]).result.hash != base
    assert forked_backend.generate(request).result.hash == base  # the merged weight died with its child
    assert forked_backend.generate(request, [adapter]).result.hash == with_adapter


@dataclass(frozen=True)
class Probe:
    """A job value (picklable, like the Backend's own) that reports what the model holds when it starts: the LoRA
    layers bound in the transformer, without applying anything."""

    workflow: str = T2VA
    label = "probe"

    def run(self, ctx: JobContext, backend: Any, sinks: Any = None) -> list[str]:
        transformer = backend.model.transformer()
        return sorted(name for name, module in transformer.named_modules() if isinstance(module, LoRALinear))


@dataclass(frozen=True)
class Relying:
    """A job that wrongly relies on what the model holds (generates without applying its adapters)."""

    request: GenerationRequest
    label = "relying"

    @property
    def workflow(self) -> str:
        return self.request.workflow

    def run(self, ctx: JobContext, backend: Any, sinks: Any = None) -> str:
        return run_generation(backend.model.pipeline(self.request.workflow), self.request).hash


@pytest.mark.slow
def test_what_a_call_attached_is_absent_in_the_next_call_and_a_job_relying_on_it_breaks(forked_backend, in_process):
    """On a dedicated box an adapter stays attached between jobs; under the fork each call starts from the parent's
    model, so a job that relied on a previous call's adapters gets the base: the hash tests above would catch it."""
    request = GenerationRequest(prompt="p", seed=2, steps=2)
    adapter = LoRASettings(source=TURBO, alpha=64.0)
    in_process.load(adapter)
    assert in_process.run(in_process.submit(Probe()))  # attached between jobs, as now
    with_adapter = in_process.run(in_process.submit(Relying(request)))
    in_process.binder.reset()
    base = in_process.run(in_process.submit(Relying(request)))
    assert with_adapter != base
    forked_backend.load(adapter)
    assert forked_backend.run(forked_backend.submit(Probe())) == []
    assert forked_backend.run(forked_backend.submit(Relying(request))) == base != with_adapter


def test_the_call_runs_in_the_submitters_context(forked_backend):
    """spaces reads the visitor (the Gradio request) from context variables: the worker thread carries the
    submitter's."""
    seen = []

    def spy(ctx: JobContext) -> None:
        seen.append(VISITOR.get())

    calls = forked_backend.wrap_job
    original = calls.call
    calls.call = lambda payload: (spy(None), original(payload))[1]
    token = VISITOR.set("visitor-7")
    try:
        forked_backend.load(LoRASettings(source=TURBO))
    finally:
        calls.call = original
        VISITOR.reset(token)
    assert seen == ["visitor-7"]


@pytest.mark.slow
def test_cancel_ends_the_child_and_says_where_it_stopped(forked_backend):
    request = GenerationRequest(prompt="rain", seed=5, steps=12)
    handle = forked_backend.submit_generate(request)
    from polling import wait_until

    wait_until(lambda: handle.progress.done >= 1, "the first step streamed out of the child", seconds=300)
    handle.cancel()
    with pytest.raises(Cancelled, match=r"cancelled after \d+ of 11 steps"):
        handle.result(timeout=120)
    with pytest.raises(ChildProcessError):  # the call's child has ended and been reaped
        os.waitpid(zero_gpu_fork.children[-1], os.WNOHANG)


def test_a_request_over_the_cap_is_refused_before_any_gpu_time_is_asked_for(forked_backend):
    forked_backend.time_model = flat_prediction(video_s=400.0, step_s=19.9, evaluations=19)
    asked = len(zero_gpu_fork.asked)
    with pytest.raises(H3AppError, match=r"over the 300 s one call may ask for: use at most 5 steps") as refused:
        forked_backend.submit_generate(GenerationRequest(prompt="p", seed=1, steps=20))
    assert "\n" not in str(refused.value) and "Turbo preset (4 steps)" in str(refused.value)
    assert len(zero_gpu_fork.asked) == asked


@pytest.mark.parametrize("seconds", [0, -5, 2.5, True, "60"])
def test_bad_durations_never_reach_the_call(seconds):
    def work() -> Any:
        yield 1

    call = zero_gpu_fork.forked(work, lambda: seconds)
    with pytest.raises(H3AppError, match="positive whole number"):
        call()


def test_quota_arithmetic():
    one = zero_gpu.declared(100.0)
    assert (one.duration_s, one.quota_s) == (145, 290)
    assert zero_gpu.videos_per_day(100.0, one, "pro") == 1 + (2400 - 290) // 200
    assert zero_gpu.videos_per_day(100.0, one, "free") == 1 + (300 - 290) // 200
    assert zero_gpu.videos_per_day(300.0, zero_gpu.declared(300.0), "pro") == 0  # over the per-call cap


def test_the_page_says_the_quota_before_generate(forked_backend):
    from h3app.ui.generate.time_note import time_words

    request = GenerationRequest(prompt="p", seed=1, steps=3)
    words = time_words({**forked_backend.predicted_time(request), "box": "this CPU"})
    assert "uses about 8 s of your ZeroGPU quota" in words  # 4 s predicted, the whole card counts twice
    assert "asks for 50 s" in words
    forked_backend.time_model = flat_prediction(video_s=400.0)
    assert "Over ZeroGPU's per-call cap" in time_words({**forked_backend.predicted_time(request), "box": "x"})


def test_without_zero_gpu_the_page_says_nothing_of_quota(in_process):
    from h3app.ui.generate.time_note import time_words

    in_process.time_model = flat_prediction()
    assert "ZeroGPU" not in time_words({**in_process.predicted_time(GenerationRequest(prompt="p")), "box": "x"})


@pytest.mark.slow
def test_compile_is_refused_on_zero_gpu_in_one_line_after_spaces_is_imported_first():
    """The real ``spaces`` package with its CUDA emulation on (SPACES_ZERO_GPU; a device API address that is never
    reached): app.py imports it first, then refuses --compile in one line, exit status 2."""
    import subprocess
    import sys

    env = {**os.environ, zero_gpu.ZERO_GPU_ENV: "true", "SPACES_ZERO_DEVICE_API_URL": "http://127.0.0.1:9",
           "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "app.py", "--compile"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == f"error: {COMPILE_REFUSED}"
    assert "Traceback" not in done.stderr


def test_ranks_and_compile_are_refused_for_a_zero_gpu_home():
    with pytest.raises(H3AppError, match="does not run on ZeroGPU"):
        home_for(zero_gpu.FORK, compile=True, ranks=1)
    with pytest.raises(H3AppError, match="one card per call"):
        home_for(zero_gpu.SPACES, compile=False, ranks=2)
    with pytest.raises(H3AppError, match="CUDA cannot run in a forked child: use --device cpu"):
        home_for(zero_gpu.FORK, compile=False, ranks=1, device="cuda:0")
    home = home_for(zero_gpu.SPACES, compile=False, ranks=1)
    assert home.box.name == "zero-gpu-xlarge" and home.judged == {"device": (home.box.gpu, 96 * 10**9), "host": None}
    assert "whole ZeroGPU RTX Pro 6000 (96 GB)" in home.line and "300 s" in home.line


@pytest.mark.slow
def test_forked_check_and_grid_equal_the_in_process_ones(forked_backend, in_process):
    """The equivalence check and the grid, each one call: the same hashes and cells as in-process, cells streamed."""
    request = GenerationRequest(prompt="a boat", seed=0, steps=3)
    adapter = LoRASettings(source=TURBO)
    expected = in_process.check_equivalence(request, adapter)
    plan = in_process.plan_grid([8.0], [0.5, 1.0], [0])
    grid_request = GenerationRequest(prompt="grid", steps=2)
    expected_cells = [(c.row, c.column, c.hash) for c in in_process.grid(grid_request, adapter, plan)]
    in_process.binder.reset()
    board = PreviewBoard()
    forked = forked_backend.check_equivalence(request, adapter, previews=board)
    assert (forked.a.hash, forked.b.hash, forked.fallback.hash) == (
        expected.a.hash, expected.b.hash, expected.fallback.hash)
    assert forked.identical and forked.control_identical
    assert {"A", "B", "fallback"} <= {column for column in ("A", "B", "fallback") if board.history(column)}
    streamed = [(c.row, c.column, c.hash) for c in forked_backend.grid(grid_request, adapter, plan)]
    assert streamed == expected_cells
    asked = zero_gpu_fork.asked[-2:]
    assert asked == [zero_gpu.declared(3 * 4.0 + 1.0).duration_s, zero_gpu.declared(3 * 4.0).duration_s]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_api_load_set_lora_generate_under_the_stand_in_give_the_in_process_hash(forked_backend, in_process,
                                                                                   tmp_path):
    """``/load`` + ``/set_lora`` + ``/generate`` through gradio_client on an app whose every job is a forked call:
    the same hash as the in-process job with the same settings, and the call's ``zerogpu`` in the result."""
    from app_fixtures import running_app
    from gradio_client import Client

    fast = {"steps": 2, "duration": 5.0, "height": 32, "width": 32}
    expected = in_process.generate(GenerationRequest(prompt="a fox", seed=4, steps=2, duration=5.0, height=32,
                                                     width=32), [LoRASettings(source=TURBO, alpha=8.0, strength=0.5)])
    in_process.binder.reset()
    with running_app(forked_backend) as url:
        client = Client(url, download_files=str(tmp_path), verbose=False)
        try:
            loaded = client.predict(slot=1, source=TURBO, alpha="auto", scale=1.0, api_name="/load")
            assert loaded["report"]["num_matched"] > 0
            client.predict(slot=1, alpha="8", scale=0.5, mode="unmerged", api_name="/set_lora")
            _, result = client.predict(prompt="a fox", seed=4, **fast, api_name="/generate")
        finally:
            client.close()
    assert result["hash"] == expected.result.hash
    assert result["zerogpu"]["mode"] == "fork" and result["zerogpu"]["duration_s"] == zero_gpu.declared(4.0).duration_s


def test_the_generate_line_keeps_the_quota_once_runs_refine_the_time(forked_backend):
    from h3app.ui.generate.estimates import Estimate, generate_line

    prediction = forked_backend.predicted_time(GenerationRequest(prompt="p", seed=1, steps=3))
    line = generate_line(Estimate(6.0, "the time model × 1.5, this server's measured ÷ predicted over 2 runs",
                                  prediction))
    assert "About 6.0 s" in line and "uses about 8 s of your ZeroGPU quota" in line


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_mcp_tools_under_the_stand_in_give_the_in_process_hashes(forked_backend, in_process):
    """``generate_video`` and ``check_alpha_equivalence`` over MCP on an app whose every job is a forked call."""
    import json

    from test_mcp_tools import mcp_app, talk

    kohya = str(ROOT / "assets" / "adapters" / "kohya_musubi.safetensors")
    fast = {"steps": 2, "duration": 5.0, "height": 32, "width": 32, "seed": 3}
    request = GenerationRequest(prompt="a fox", seed=3, steps=2, duration=5.0, height=32, width=32)
    expected = in_process.generate(request, [LoRASettings(source=kohya, alpha=3.0, strength=0.5)]).result.hash
    check = in_process.check_equivalence(request, LoRASettings(source=kohya))
    in_process.binder.reset()
    generate = ("generate_video", {"prompt": "a fox", "source": kohya, "alpha": "3", "scale": 0.5, **fast})
    with mcp_app(forked_backend) as url:
        _, (video, checked) = talk(url, [generate, ("check_alpha_equivalence",
                                                     {"source": kohya, "prompt": "a fox", **fast})], [])
    assert not video.isError and not checked.isError, (video.content, checked.content)
    answer, verdict = json.loads(video.content[1].text), json.loads(checked.content[0].text)
    assert answer["hash"] == expected and answer["zerogpu"]["mode"] == "fork"
    assert (verdict["hash_a"], verdict["hash_fallback"]) == (check.a.hash, check.fallback.hash)
    assert verdict["identical"] is True


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_cli_generate_check_and_grid_under_the_stand_in_give_the_in_process_hashes(monkeypatch, capsys, tmp_path):
    import json

    from cli_runner import run_cli

    def run(*argv: str) -> dict[str, Any]:
        done = run_cli(capsys, *argv, "--json")
        assert done.code == 0, done.err
        return json.loads(done.out)

    common = ("--model", "tiny", "--adapter", TURBO, "--steps", "2", "--height", "32", "--width", "32")
    results = {}
    for home in ("in-process", "fork"):
        if home == "fork":
            monkeypatch.setenv(zero_gpu.FORK_ENV, "1")
        else:
            monkeypatch.delenv(zero_gpu.FORK_ENV, raising=False)
        generated = run("generate", *common, "--prompt", "a fox", "--seed", "4", "--out", str(tmp_path / f"{home}.mp4"))
        checked = run("check", *common, "--mode", "full")
        grid = run("grid", *common, "--prompt", "grid", "--alphas", "8", "--scales", "0.5,1",
                   "--out-dir", str(tmp_path / f"grid-{home}"))
        results[home] = (generated, checked, grid)
    (generated, checked, grid), (forked, forked_check, forked_grid) = results["in-process"], results["fork"]
    assert forked["hash"] == generated["hash"] and forked["zerogpu"]["mode"] == "fork" and "zerogpu" not in generated
    assert [forked_check[k] for k in ("hash_a", "hash_b", "hash_fallback")] == [
        checked[k] for k in ("hash_a", "hash_b", "hash_fallback")]
    assert forked_check["zerogpu"]["mode"] == "fork" and "zerogpu" not in checked  # the one call it asked for
    assert [c["hash"] for c in forked_grid["cells"]] == [c["hash"] for c in grid["cells"]]


def test_a_check_and_a_grid_over_the_cap_are_refused_with_what_fits(forked_backend):
    """Room for 104 s of predicted work a call ((300 / 2 − 20) / 1.25): a check whose one run alone (120 s: steps
    2 s each, 19 evaluations, 82 s outside them) is over it cannot be split into calls per run and says what fits,
    before any call; so is a grid whose one run alone is over it (its baseline as a call of its own does not fit)."""
    forked_backend.time_model = flat_prediction(video_s=120.0, step_s=2.0, evaluations=19)
    request = GenerationRequest(prompt="p", seed=1, steps=20)
    asked = len(zero_gpu_fork.asked)
    with pytest.raises(H3AppError, match=r"^this request would ask for 340 s of ZeroGPU quota .*over the 300 s one "
                                         r"call may ask for: a check too long for one call runs as one call per "
                                         r"run, and one run is about 120 s; use at most 12 steps") as refused:
        forked_backend.submit_equivalence(request, LoRASettings(source=TURBO))
    assert "\n" not in str(refused.value) and len(zero_gpu_fork.asked) == asked
    plan = forked_backend.plan_grid([8.0], [0.5, 1.0], [0])
    with pytest.raises(H3AppError, match=r"^this request would ask for 340 s of ZeroGPU quota .*: a grid too long for "
                                         r"one call runs as calls of one run or more, and one run is about 120 s; "
                                         r"use at most 12 steps") as refused:
        forked_backend.submit_grid(request, LoRASettings(source=TURBO), plan)
    assert "\n" not in str(refused.value) and len(zero_gpu_fork.asked) == asked


@pytest.mark.slow
def test_a_grid_over_the_cap_runs_as_several_calls_that_each_fit(forked_backend, in_process):
    """Three runs (two cells and the baseline) of 40 s are over one call's 104 s; one cell and its baseline fit:
    two calls, each declaring 20 + 1.25 × 80 = 120 s, and the cells are the in-process grid's, in its order."""
    adapter, request = LoRASettings(source=TURBO), GenerationRequest(prompt="grid", steps=2)
    plan = in_process.plan_grid([8.0], [0.5, 1.0], [0])
    expected = [(c.row, c.column, c.hash, c.baseline_psnr) for c in in_process.grid(request, adapter, plan)]
    in_process.binder.reset()
    forked_backend.time_model = flat_prediction(video_s=40.0, step_s=2.0, evaluations=19)
    asked = len(zero_gpu_fork.asked)
    steps: list[tuple[int, int]] = []
    cells = [(c.row, c.column, c.hash, c.baseline_psnr)
             for c in forked_backend.grid(request, adapter, plan, on_step=lambda d, t: steps.append((d, t)))]
    assert cells == expected
    assert zero_gpu_fork.asked[asked:] == [120, 120]
    assert steps[-1] == (4, 4)  # the whole grid's evaluations: two calls of a baseline and a cell, 1 each


VERDICT = ("identical", "hash_a", "hash_b", "hash_fallback", "max_abs_diff", "fallback_max_abs_diff",
           "control_identical", "effective_scale_a", "effective_scale_b", "effective_scale_fallback", "a_vs_b",
           "a_vs_fallback", "parts", "parts_note")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_check_over_the_cap_runs_as_one_call_per_run_with_the_in_process_verdict(forked_backend, in_process):
    """Three 40 s runs and a 2 s step (122 s) are over one call's 104 s; each run fits: four calls (the fallback,
    A, the control, B), each declaring its own run (20 + 1.25 × 40 = 70 s; the control 20 + 1.25 × 2 = 23 s), and
    the verdict is the in-process check's, field for field; progress counts the whole check."""
    from h3app.backend.equivalence import PHASES

    request, adapter = GenerationRequest(prompt="a boat", seed=0, steps=3), LoRASettings(source=TURBO, alpha=8.0)
    expected = in_process.check_equivalence(request, adapter).to_json()
    in_process.binder.reset()
    forked_backend.time_model = flat_prediction(video_s=40.0, step_s=2.0, evaluations=19)
    asked, steps, board = len(zero_gpu_fork.asked), [], PreviewBoard()
    forked = forked_backend.check_equivalence(request, adapter, on_step=lambda d, t: steps.append((d, t)),
                                              previews=board).to_json()
    assert {key: forked[key] for key in VERDICT} == {key: expected[key] for key in VERDICT}
    assert forked["identical"] and forked["control_identical"] and forked["fallback_max_abs_diff"] > 0
    assert zero_gpu_fork.asked[asked:] == [70, 70, 23, 70]
    zerogpu = forked["zerogpu"]
    assert zerogpu["calls"] == 4 and zerogpu["runs"] == list(PHASES) and zerogpu["quota_s"] == 2 * (3 * 70 + 23)
    assert [d["duration_s"] for d in zerogpu["durations"]] == [70, 70, 23, 70] and "zerogpu" not in expected
    assert steps[-1] == (7, 7)  # 3 runs of 2 evaluations and the control's step, over the four calls
    assert all(board.history(column) for column in ("A", "B", "fallback"))
    assert Path(forked["b"]["video_path"]).is_file() and Path(forked["heatmap"]).is_file()
    # the page's verdict says so: only the split check, with the quota all its calls asked for
    assert f"Ran as 4 ZeroGPU calls, one per run (quota asked: {zerogpu['quota_s']} s)" in verdict_html(forked)
    assert "ZeroGPU" not in verdict_html(expected)


@pytest.mark.slow
def test_cancel_during_a_split_check_starts_no_more_calls(forked_backend):
    """Cancel while the first of the four calls runs: that call ends and no other is asked for."""
    from polling import wait_until

    forked_backend.time_model = flat_prediction(video_s=40.0, step_s=2.0, evaluations=19)
    asked = len(zero_gpu_fork.asked)
    handle = forked_backend.submit_equivalence(GenerationRequest(prompt="rain", seed=5, steps=12),
                                               LoRASettings(source=TURBO))
    wait_until(lambda: handle.progress.done >= 1, "the fallback's first step streamed out of its call", seconds=300)
    handle.cancel()
    with pytest.raises(Cancelled, match=r"cancelled after \d+ of 34 steps"):  # 3 × 11 evaluations + 1
        handle.result(timeout=120)
    assert zero_gpu_fork.asked[asked:] == [70]


def test_a_split_check_stops_between_calls_when_cancelled():
    """``check_calls.run``: a cancel seen after a call ends starts no further call and says where it stopped."""
    from h3app.backend import check_calls
    from h3app.backend.worker import JobHandle

    handle = JobHandle(id=1, label="check", run=lambda ctx: None)
    ctx = JobContext(handle)
    duration = zero_gpu.declared(4.0)
    split = [check_calls.Part(label, None, duration, 1 if label == "control" else 2)  # type: ignore[arg-type]
             for label in ("fallback", "A", "control", "B")]
    made: list[str] = []

    def one_call(part: Any, whole: Any) -> Any:
        made.append(part.label)
        whole.on_step(part.steps, part.steps)
        handle.cancel()
        return part.label

    with pytest.raises(Cancelled, match="cancelled after 2 of 7 steps"):
        check_calls.run(split, ctx, one_call, lambda runs, started: runs)
    assert made == ["fallback"]


def test_the_check_line_says_it_ran_as_one_call_per_run_and_the_quota_each_asked():
    from h3app.backend import check_calls
    from h3app.commands.check import zero_gpu_line

    run, step = zero_gpu.declared(40.0), zero_gpu.declared(2.0)
    split = [check_calls.Part(label, None, step if label == "control" else run, 1)  # type: ignore[arg-type]
             for label in ("fallback", "A", "control", "B")]
    line = zero_gpu_line(check_calls.record(split))
    assert line == ("\nZeroGPU: over one call's 300 s cap, so run as 4 calls, one per run (quota asked: fallback "
                    "140 s, A 140 s, control 46 s, B 140 s)")
    assert zero_gpu_line(run.to_json()) == "\nZeroGPU: one call of 70 s (140 s of quota asked)"
    assert zero_gpu_line(None) == ""
