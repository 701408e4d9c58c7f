"""bench/: the command runs and prints a table with ratios; its pieces do what they say. No timing asserts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

REPO = Path(__file__).resolve().parents[1]


def _bench(*args: str, cache: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "H3APP_BENCH_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.slow
def test_quick_p3_prints_a_table_with_ratios(tmp_path: Path) -> None:
    result = _bench("--quick", "--only", "P3", cache=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "| case | what | ours | peer | peer time | ratio | goal | met? | measured | note |" in out
    rows = [line for line in out.splitlines() if line.startswith("| P3 |")]
    assert len(rows) == 3, out  # PEFT is installed here (requirements-dev): all three rows have a peer
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[5].endswith("×") or "× (1/" in cells[5], row  # a ratio, not "—"
        assert cells[7] in ("yes", "**no**"), row
        assert cells[8].partition(", ")[0] == "cpu", row  # P3 is single-threaded compute: CPU time by default
    assert [row.split(" | ")[8] for row in rows] == ["cpu, median", "cpu, best of 5", "cpu, median"]  # growth: best
    assert "CPU: " in out and "torch threads: 1" in out and "load average" in out
    assert "rows meet their goal" in out
    assert list(tmp_path.glob("lightx2v-narrow52-*.safetensors")), "the adapter fixture is written to the cache dir"
    assert not list(tmp_path.glob("*.partial"))


def test_unknown_case_is_refused_with_the_choices(tmp_path: Path) -> None:
    result = _bench("--only", "P9", cache=tmp_path, timeout=60)
    assert result.returncode == 2
    assert "P1, P2, P3, P4, P5, P6, P7" in result.stderr
    assert result.stdout == ""


def test_parse_only_keeps_table_order() -> None:
    from bench.run import parse_only

    assert parse_only("p3, P1") == ["P1", "P3"]
    assert parse_only(None) == ["P1", "P2", "P3", "P4", "P5", "P6", "P7"]


def test_goal_and_ratio() -> None:
    from bench.table import Goal, Row, format_ratio, render_markdown

    both = Goal("≤ 50 ms and ≤ 1/50", max_ratio=0.02, max_seconds=0.05)
    assert both.met(0.01, 0.01) is True
    assert both.met(0.06, 0.01) is False  # too slow in absolute terms
    assert both.met(0.01, 0.5) is False  # ratio missed
    assert both.met(0.01, None) is None  # peer missing: unknown, not a pass
    row = Row("P9", "thing", 0.2, "peer", 0.1, Goal("≤ 1.5×", max_ratio=1.5), "a | b", "cpu")
    assert row.ratio == pytest.approx(2.0) and row.met is False
    table = render_markdown([row])
    assert "| P9 | thing | 200.00 ms | peer | 100.00 ms | 2.00× | ≤ 1.5× | **no** | cpu, median | a \\| b |" in table
    best = Row("P9", "wall thing", 0.2, "peer", 0.1, Goal("≤ 1.5×", max_ratio=1.5), "", "wall", statistic="best of 5")
    assert "| **no** | wall, best of 5 |" in render_markdown([best]) and best.to_json()["statistic"] == "best of 5"
    assert format_ratio(0.02) == "0.02× (1/50)"
    assert format_ratio(None) == "—"


def test_cpu_clock_ignores_sleeping_but_wall_clock_does_not() -> None:
    import time

    from bench.timing import Variant, compare

    timings = {clock: compare([Variant("sleep", lambda: time.sleep(0.05))], repeats=2, warmup=0, clock=clock)
               for clock in ("cpu", "wall")}
    assert timings["wall"]["sleep"].median >= 0.05
    assert timings["cpu"]["sleep"].median < 0.02  # waiting costs no CPU: the cpu clock measures work only
    with pytest.raises(ValueError):
        compare([Variant("x", lambda: None)], repeats=1, clock="sundial")


def test_compare_interleaves_and_runs_setup_around_each_call() -> None:
    from bench.timing import Variant, compare

    log: list[str] = []
    timings = compare([Variant("a", lambda: log.append("a"), setup=lambda: log.append("setup-a"),
                               teardown=lambda: log.append("teardown-a")),
                       Variant("b", lambda: log.append("b"), inner=3)], repeats=2, warmup=1)
    assert len(timings["a"].runs) == 2 and len(timings["b"].runs) == 2
    assert log[:3] == ["setup-a", "a", "teardown-a"]  # warm-up of a
    assert log[3:6] == ["b", "b", "b"]  # warm-up of b, inner=3
    # round 1: a then b; round 2: b then a (rotated)
    assert log[6:] == ["setup-a", "a", "teardown-a", "b", "b", "b", "b", "b", "b", "setup-a", "a", "teardown-a"]


def test_adapter_file_is_a_valid_lightx2v_layout_and_is_reused(tmp_path: Path) -> None:
    from safetensors import safe_open

    from bench.adapter_files import cached_adapter_file, lightx2v_layout
    from h3app.adapters.inspect import inspect_file
    from h3app.model.tiny import TINY_TRANSFORMER_CONFIG

    specs = lightx2v_layout(TINY_TRANSFORMER_CONFIG, 4, torch.bfloat16)
    assert len(specs) == 4 * 6 * 2  # 2 main + 2 refiner blocks, six targets, A and B
    path, written = cached_adapter_file(tmp_path, "tiny", specs, {"alpha": "8"})
    assert written
    with safe_open(str(path), framework="pt") as handle:
        assert set(handle.keys()) == {s.key for s in specs}
        down = handle.get_tensor("transformer_blocks.0.attn.to_q.lora_A.default.weight")
        assert down.dtype == torch.bfloat16 and tuple(down.shape) == (4, 24)
        assert 0 < float(down.float().abs().max()) <= (3 / 24) ** 0.5 + 1e-2  # seeded uniform, 1/√in scale
    info = inspect_file(path)
    assert (info.rank, info.alpha, info.alpha_source, info.num_targets) == (4, 8.0, "metadata", 24)
    again, written_again = cached_adapter_file(tmp_path, "tiny", specs, {"alpha": "8"})
    assert again == path and not written_again
    path.write_bytes(path.read_bytes()[:-1])  # a damaged (short) file is not reused
    _, rewritten = cached_adapter_file(tmp_path, "tiny", specs, {"alpha": "8"})
    assert rewritten


def test_sequence_rows_match_the_reference_arithmetic() -> None:
    from bench.models import sequence_rows

    rows = sequence_rows(544, 960, 124)
    assert (rows["latent_frames"], rows["grid_h"], rows["grid_w"]) == (37, 17, 30)
    assert rows["video"] == 18_870 and rows["audio"] == 414
    assert sequence_rows(768, 1344, 124)["video"] == 37_296  # docs: 37 × 24 × 42


def test_packed_input_runs_through_the_model() -> None:
    from bench.models import build_transformer, packed_input_for_tokens
    from h3app.model.tiny import TINY_TRANSFORMER_CONFIG

    model = build_transformer(TINY_TRANSFORMER_CONFIG)
    inputs = packed_input_for_tokens(TINY_TRANSFORMER_CONFIG, 40)
    assert inputs["position_ids"].shape == (40, 3)
    with torch.no_grad():
        out = model(**inputs)
    assert out.sample.shape[1] == inputs["video_indices"].numel()
    assert torch.isfinite(out.sample).all() and float(out.sample.abs().max()) > 0


def test_gpu_script_refuses_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import gpu

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal path is not reachable")
    assert gpu.main(["--resolutions", "544p", "--repeats", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == gpu.NO_CUDA_MESSAGE
    assert captured.out == ""


def test_gpu_script_parses_its_arguments() -> None:
    from bench import gpu

    args = gpu.build_parser().parse_args(["--resolutions", "768p, 544p,768p", "--frames", "22", "--peft"])
    assert args.resolutions == ["768p", "544p"] and args.frames == 22 and args.peft and not args.no_merged
    assert gpu.build_parser().parse_args([]).resolutions == ["544p", "768p"]
    for bad in (["--resolutions", "1080p"], ["--repeats", "0"], ["--frames", "x"]):
        with pytest.raises(SystemExit) as exit_info:
            gpu.build_parser().parse_args(bad)
        assert exit_info.value.code == 2
    assert gpu.cuda_device("cpu") is None  # a non-CUDA device name is refused, not run on


def test_gpu_model_builder_keeps_the_float32_islands() -> None:
    """The builder bench/gpu.py uses on the GPU, exercised on the CPU with the tiny config."""
    from bench.gpu import build_full_size
    from h3app.model.tiny import TINY_TRANSFORMER_CONFIG

    model = build_full_size("cpu", dict(TINY_TRANSFORMER_CONFIG))
    assert torch.get_default_dtype() == torch.float32  # restored
    assert model.transformer_blocks[0].attn.to_q.weight.dtype == torch.bfloat16
    assert model.context_embedder.weight.dtype == torch.bfloat16
    for name in ("proj_in", "audio_proj_in", "proj_out", "audio_proj_out"):
        assert getattr(model, name).weight.dtype == torch.float32, name
    assert model.time_embedder.linear_1.weight.dtype == torch.float32
    assert model.rope.inv_freq.dtype == torch.float32


def test_gpu_placement_rows_time_both_pristine_placements_on_the_cpu() -> None:
    """bench/gpu.py's merged re-apply rows (pristine copies on the device, then in host RAM), on the tiny model."""
    from lora_fixtures import block_targets, build_tiny, linear_shapes, make_adapter, state_hash

    from bench.gpu import ADAPTER, placement_rows
    from h3app.lora.engine import LoRAEngine
    from h3app.settings import LoRASettings

    model = build_tiny()
    base = state_hash(model)
    shapes = linear_shapes(model)
    engine = LoRAEngine(model)
    engine.attach(make_adapter(shapes, block_targets(shapes), alpha=8.0), LoRASettings(source="tiny", alpha=8.0),
                  ADAPTER)
    seen: list[tuple[str, int]] = []

    def timer(change) -> float:
        change()
        seen.append((engine.pristine.prefer, len(engine.pristine)))
        return 0.25

    rows = placement_rows(engine, 24, timer)
    assert [row[0] for row in rows] == ["alpha re-apply, merged, pristine copies on the GPU",
                                        "alpha re-apply, merged, pristine copies in pinned host RAM"]
    assert [row[2] for row in rows] == [0.25, 0.25] and all(row[3] == "24 targets re-merged" for row in rows)
    assert [prefer for prefer, _ in seen] == ["device", "ram"] and all(held > 0 for _, held in seen)
    assert engine.mode == "unmerged" and len(engine.pristine) == 0  # left as it was
    engine.detach()
    assert state_hash(model) == base
