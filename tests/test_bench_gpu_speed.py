"""bench/gpu.py --speed (bench/gpu_speed.py) on the CPU: the rows it builds, the prediction column from a rehearsal,
the table's adjacent predicted/measured columns, and the measuring code run on the tiny model (no timing asserted)."""

from __future__ import annotations

import time

import pytest
import torch

from bench.gpu_speed import REFUSED, VARIANTS, measure_steps, predicted_steps, speed_rows, table

PREDICTED = {(p, lora): 1.0 + i for i, (p, lora) in enumerate(
    (p, lora) for p in ("bf16", "fp8") for lora in ("none", "unmerged", "merged")) if (p, lora) not in REFUSED}


def test_one_row_per_variant_with_measured_beside_predicted_and_reasons_where_none():
    measured = {("bf16", "eager", "none"): 2.0, ("bf16", "compiled", "unmerged"): "skipped: past the 360 s budget"}
    rows = speed_rows(PREDICTED, measured)
    assert [(r.precision, r.mode, r.lora) for r in rows] == list(VARIANTS) and len(rows) == 12
    first = rows[0]
    assert first.predicted_s == PREDICTED[("bf16", "none")] and first.measured_s == 2.0
    assert first.ratio == pytest.approx(2.0 / PREDICTED[("bf16", "none")])
    by_key = {(r.precision, r.mode, r.lora): r for r in rows}
    assert by_key[("bf16", "compiled", "unmerged")].note.startswith("skipped")
    assert by_key[("bf16", "compiled", "unmerged")].ratio is None
    assert by_key[("fp8", "eager", "merged")].note.startswith("refused") and by_key[("fp8", "eager", "merged")].predicted_s is None
    assert by_key[("fp8", "eager", "unmerged")].note == "not measured"


def test_the_table_puts_predicted_and_measured_in_adjacent_columns():
    text = table(speed_rows(PREDICTED, {("bf16", "eager", "none"): 0.5}))
    header = [cell.strip() for cell in text.splitlines()[0].strip("|").split("|")]
    assert header.index("measured step") == header.index("predicted step") + 1
    assert "| bf16 | eager | none | 1.000 s | 0.500 s | 0.50× |" in text
    assert len(text.splitlines()) == 2 + len(VARIANTS)


@pytest.mark.slow
def test_predictions_come_from_the_roofline_for_the_gpu_and_none_for_an_unknown_one(tiny_rank4_measured):
    tiny_plan = tiny_rank4_measured  # the session's tiny rehearsal (tests/rehearsal_fixtures.py)
    from h3app.hardware.planner import Placement
    from h3app.hardware.roofline import PEAKS, step_seconds

    predicted = predicted_steps(tiny_plan, "NVIDIA H200")
    assert predicted[("bf16", "unmerged")] == step_seconds(tiny_plan, Placement(), PEAKS["H200"], "unmerged")
    assert predicted[("bf16", "none")] == predicted[("bf16", "merged")] == \
        step_seconds(tiny_plan, Placement(), PEAKS["H200"], None)
    assert predicted[("fp8", "merged")] is None
    assert predicted[("fp8", "none")] <= predicted[("bf16", "none")]  # fp8 reads half the weight bytes
    assert set(predicted_steps(tiny_plan, "Tesla T4").values()) == {None}


def test_the_measuring_runs_every_eager_variant_on_the_tiny_model():
    from lora_fixtures import linear_shapes, make_adapter

    from bench.gpu import build_full_size
    from h3app.backend.transformer_check import packed_check_input
    from h3app.lora.engine import LoRAEngine
    from h3app.model.tiny import TINY_TRANSFORMER_CONFIG
    from h3app.settings import LoRASettings

    model = build_full_size("cpu", dict(TINY_TRANSFORMER_CONFIG))
    shapes = linear_shapes(model)
    adapter = make_adapter(shapes, [t for t in shapes if t != "time_embedder.linear_1"], rank=4, dtype=torch.bfloat16)
    engine = LoRAEngine(model)
    inputs = packed_check_input(model.config, seed=0)
    calls = []

    def step():
        calls.append(1)
        with torch.no_grad():
            return model(**inputs)

    def timer(operation):
        started = time.perf_counter()
        operation()
        return time.perf_counter() - started

    measured = measure_steps(model, engine, lambda: engine.attach(adapter, LoRASettings(source="s", alpha=8), "b"),
                             step, timer, "cpu", modes=("eager",))
    assert set(measured) == {("bf16", "eager", "none"), ("bf16", "eager", "unmerged"), ("bf16", "eager", "merged"),
                             ("fp8", "eager", "none"), ("fp8", "eager", "unmerged")}
    assert all(isinstance(value, float) for value in measured.values()) and len(calls) == 5
    assert model.transformer_blocks[0].attn.to_q.weight.dtype == torch.float8_e4m3fn  # fp8 storage was on
    assert not engine.active()  # left without adapters
    other = build_full_size("cpu", dict(TINY_TRANSFORMER_CONFIG))
    skipped = measure_steps(other, LoRAEngine(other), lambda: None, step, timer, "cpu", budget_s=-1.0,
                            modes=("eager",))
    assert all(str(value).startswith("skipped") for value in skipped.values())
