"""``python -m h3app grid``: bad axes are one line before any model loads; on two ranks (gloo, tiny model) the grid
job is replayed by the follower and rank 0 writes one mp4 per cell."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from h3app import cli

ROOT = Path(__file__).resolve().parents[1]
ADAPTER = str(ROOT / "assets" / "adapters" / "lightx2v_turbo_no_alpha.safetensors")


@pytest.mark.parametrize("flag, value, words", [
    ("--scales", "1,abc", "--scales must be comma-separated numbers"),
    ("--alphas", "-3", "alpha"),
    ("--seeds", "1.5", "seed must be a whole number"),
])
def test_bad_axes_are_one_line(capsys, tmp_path, flag, value, words):
    code = cli.main(["grid", "--adapter", ADAPTER, "--prompt", "x", "--out-dir", str(tmp_path), flag, value])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and words in err


@pytest.mark.slow
def test_grid_on_two_ranks_writes_one_mp4_per_cell(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "h3app", "grid", "--adapter", ADAPTER, "--prompt", "a red kite",
                           "--alphas", "auto", "--scales", "0.5", "--steps", "2", "--ulysses", "2",
                           "--out-dir", str(tmp_path / "cells"), "--json"],
                          env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    assert result["parallel"] == "ulysses 2"
    (cell,) = result["cells"]
    assert Path(cell["video_path"]).stat().st_size > 0 and cell["strength"] == 0.5
    assert cell["baseline_max_abs_diff"] > 0  # the adapter moved the output away from the no-LoRA baseline
