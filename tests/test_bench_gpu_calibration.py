"""``python -m bench.gpu --calibration``'s rows without a GPU: each measurement beside the plan's own one-rank
prediction for the card (the same numbers ``plan --json`` prints), SDPA measured after the card's backend."""

from __future__ import annotations

import pytest

from bench import gpu_calibration
from bench.gpu import build_parser


def test_the_flag_selects_the_calibration_run():
    assert build_parser().parse_args(["--calibration"]).calibration
    assert not build_parser().parse_args([]).calibration


def test_the_cards_backend_is_timed_first_then_sdpa_each_beside_its_prediction():
    used, timings = [], iter([2.0, 3.0])
    rows = gpu_calibration.step_rows(lambda: None, used.append, "cudnn", lambda op: next(timings),
                                     {"step": 1.6, "step_sdpa": 2.2})
    assert used == ["sdpa"]
    assert [(r.predicted_s, r.measured_s) for r in rows] == [(1.6, 2.0), (2.2, 3.0)]
    assert rows[0].ratio == pytest.approx(2.0 / 1.6)
    alone = gpu_calibration.step_rows(lambda: None, used.append, "sdpa", lambda op: 1.0, {"step": 1.0})
    assert len(alone) == 1 and used == ["sdpa"]  # SDPA is the card's own: not timed twice


def test_a_gpu_without_spec_sheet_peaks_gets_no_prediction():
    assert set(gpu_calibration.predictions("NVIDIA GeForce RTX 4090", "sdpa").values()) == {None}


@pytest.mark.slow  # two full-size rehearsals (fp32 and bf16 decoder), ~1 minute on 2 cores
def test_the_predictions_are_the_plans_one_rank_figures_for_the_card():
    from bench.calibration import plan_json

    out = gpu_calibration.predictions("NVIDIA H200", "fa3")
    audio = []
    for dtype in ("float32", "bfloat16"):
        plan = plan_json(("--hardware", "h200", "--vae-dtype", dtype, "--no-limits"))["predicted"]["h200"]
        assert plan["attention"] == "fa3" and out["step"] == pytest.approx(plan["step_s"], abs=1e-4)
        audio.append(plan["decode_s"] - out[f"decode_{dtype}"])  # the plan's decode = video + audio
    assert 0 < audio[0] == pytest.approx(audio[1], abs=2e-3)  # the audio decode does not follow --vae-dtype
    assert out["decode_float32"] > out["decode_bfloat16"]
    assert out["step_sdpa"] > out["step"]  # SDPA's attention is FA2's kernel on Hopper: slower than FA3's
