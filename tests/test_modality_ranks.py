"""Per-modality strength under context parallel (two CPU ranks with gloo, tests/modality_ranks_driver.py): each
rank's rows carry their own factors, so the sharded forward gives the one-process result — on a sequence of even
length and on an odd one, where the ranks hold unequal shares. Tolerance as tests/test_parallel_ranks.py (ranks
sum attention in another order: not bitwise)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from modality_ranks_driver import LENGTHS, SETTINGS, model_and_adapter, outputs  # noqa: E402

from h3app.lora.engine import LoRAEngine  # noqa: E402

DRIVER = ROOT / "tests" / "modality_ranks_driver.py"
TOLERANCE = 1e-5

pytestmark = pytest.mark.slow


def test_two_ranks_give_the_one_process_result_with_modality_factors(tmp_path):
    out = tmp_path / "ranks.npz"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(DRIVER), str(out), "--ulysses", "2", "--parallel-timeout", "120"],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = np.load(out)
    model, adapter = model_and_adapter()
    engine = LoRAEngine(model)
    engine.attach(adapter, SETTINGS, "a")
    single = outputs(model)
    engine.detach()
    for name in LENGTHS:
        for part in ("video", "audio"):
            key = f"{name}_{part}"
            assert ranks[key].shape == single[key].shape
            assert np.abs(ranks[key] - single[key]).max() <= TOLERANCE, key
            # the factors matter far beyond the tolerance: ranks without them differ
            assert np.abs(ranks[f"plain_{key}"] - single[key]).max() > 100 * TOLERANCE, key
