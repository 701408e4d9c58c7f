"""docs/hardware.md's calibration and decode tables are what ``python -m bench.calibration`` makes from ``plan --json``
today; the published runs it sets the plan beside; the issue's Ulysses rows within their bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import calibration

ROOT = Path(__file__).resolve().parents[1]


def test_every_published_number_has_a_row_and_every_run_the_app_can_run_names_its_flags():
    runs = {(row.source, row.run) for row in calibration.PUBLISHED}
    assert len(runs) == 10  # sglang: 7 runs (3 on 4× H200, 8× H200, 16× H200, 8× B300, RTX 4090); vLLM-Omni: 3
    for row in calibration.PUBLISHED:
        assert row.seconds > 0 and row.measure in ("denoise", "step", "decode", "video")
        assert (row.flags is None) == bool(row.why)  # no configuration: says why
        if row.flags is not None:
            gpus = int(row.flags[row.flags.index("--hardware") + 1].rsplit("x", 1)[1])
            assert row.flags[row.flags.index("--ulysses") + 1] == str(gpus)  # Ulysses over every GPU of the box


def test_a_published_denoise_is_set_beside_the_plans_evaluations_times_its_step():
    prediction = {"evaluations": 49, "step_s": 1.5, "decode_s": 2.0, "video_s": 80.0}
    assert calibration.seconds_of("denoise", prediction) == pytest.approx(73.5)
    assert calibration.seconds_of("step", prediction) == 1.5
    assert calibration.seconds_of("decode", prediction) == 2.0 and calibration.seconds_of("video", prediction) == 80


@pytest.mark.slow  # three full-size rehearsals (~1 minute on 2 cores) and a plan per row's flags
def test_the_docs_tables_are_the_scripts_output_from_the_plan():
    docs = (ROOT / "docs" / "hardware.md").read_text()
    for (start, end), block in calibration.blocks().items():
        assert f"{start}\n{block}\n{end}" in docs, f"run `python -m bench.calibration --write` ({start})"


@pytest.mark.slow
@pytest.mark.parametrize("gpus, step, decode, video", [(4, 71.73 / 49, 1.32, 74.38), (8, 0.749, None, None)])
def test_the_ulysses_rows_land_within_the_published_runs_bounds(gpus, step, decode, video):
    """``plan --hardware h200xN --ulysses N --steps 50 --offload none`` at the defaults (``--vae-dtype auto``: the
    bf16 decoder on a GPU, as the sources decode): the step within ±25 %, the decode (tiles over the ranks) within
    ±50 %, the video within ±25 % of sglang's runs."""
    assert "--vae-dtype" not in calibration.REQUEST  # the defaults, as a person runs them
    out = calibration.predicted(calibration.h200(gpus), {})
    assert out["step_s"] == pytest.approx(step, rel=0.25)
    if decode is not None:
        assert out["decode_s"] == pytest.approx(decode, rel=0.5)
        assert out["video_s"] == pytest.approx(video, rel=0.25)
