"""Context parallel on CPU: two ranks with gloo against one process (tiny model, 2 steps = 1 evaluation).

One run of ``tests/parallel_driver.py --ulysses 2`` (every rank runs it; rank 0 drives a Backend, rank 1 follows
and carries an injected fault) covers generate with and without an adapter, a failure on rank 1, cancel and a dead
rank; one ``check --mode full --ulysses 2`` covers the CLI. Tolerance on decoded frames and audio: max |Δ| ≤ 1e-4
(values in [0, 1] and [-1, 1]; 1/40 of one 8-bit video level). Ranks split the sequence, so attention sums in a
different order than in one process: observed 1.5e-7 without and 1.3e-6 with the adapter, not bitwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from h3app.backend.service import Backend
from h3app.parallel.diagnostics import state_digest
from h3app.settings import LoRASettings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from parallel_driver import ADAPTER, REQUEST  # noqa: E402

DRIVER = ROOT / "tests" / "parallel_driver.py"
TOLERANCE = 1e-4
RUN_TIMEOUT_S = 900  # a hang fails here instead of blocking CI

pytestmark = [pytest.mark.slow, pytest.mark.timeout(RUN_TIMEOUT_S)]


def _env(folder: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(folder / "hf-home"), "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    folder = tmp_path_factory.mktemp("two-ranks")
    out = folder / "out.json"
    done = subprocess.run([sys.executable, str(DRIVER), str(out), "--ulysses", "2", "--parallel-timeout", "120"],
                          env=_env(folder), capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text()), folder


@pytest.fixture(scope="module")
def one_process(tiny_model, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same jobs in this process, on the session's tiny model (the ranks load the same checkpoint)."""
    backend = Backend(loaded=tiny_model, output_dir=tmp_path_factory.mktemp("one-process"))
    try:
        base = state_digest(backend.model.transformer())
        plain = backend.generate(REQUEST).result
        adapter = backend.generate(REQUEST, (LoRASettings(source=ADAPTER, strength=1.0),)).result
    finally:
        backend.binder.reset()
        backend.close()
    return {"base": base, "plain": plain, "adapter": adapter}


@pytest.mark.parametrize("name", ["plain", "adapter"])
def test_two_ranks_match_one_process_on_frames_and_audio(ranks, one_process, name):
    out, folder = ranks
    arrays = np.load(folder / f"{name}.npz")
    single = one_process[name]
    assert arrays["video"].shape == single.video.shape and arrays["audio"].shape == single.audio.shape
    assert np.abs(arrays["video"] - single.video).max() <= TOLERANCE
    assert np.abs(arrays["audio"] - single.audio).max() <= TOLERANCE
    if name == "adapter":  # the tolerance is far below what the adapter changes
        plain = np.load(folder / "plain.npz")
        assert np.abs(arrays["video"] - plain["video"]).max() > 100 * TOLERANCE


def test_every_rank_holds_the_same_weights(ranks, one_process):
    out, _ = ranks
    assert out["digests_base"] == [one_process["base"]] * 2
    with_adapter = out["digests_with_adapter"]
    assert with_adapter[0] == with_adapter[1] != one_process["base"]


def test_failure_on_rank_1_is_one_line_and_every_rank_returns_to_base(ranks, one_process):
    out, _ = ranks
    kind, message = out["injected_error"]
    assert kind == "PeerFailed" and "\n" not in message
    assert "rank 1" in message and "injected fault on rank 1" in message
    assert out["outcomes_injected"][1].startswith("Injected")
    assert out["outcomes_injected"][0].startswith("PeerFailed")
    assert out["digests_after_failure"] == [one_process["base"]] * 2
    assert out["hash_after_failure"] == out["hash_plain"]  # the next job runs normally


def test_cancel_stops_both_ranks_at_the_same_step(ranks):
    out, _ = ranks
    kind, message = out["cancel_error"]
    assert kind == "Cancelled"
    assert out["outcomes_cancel"] == [f"Cancelled: {message}"] * 2
    assert out["hash_after_cancel"] == out["hash_plain"]


def test_a_dead_rank_gives_one_line_instead_of_a_hang(ranks):
    out, _ = ranks
    first, second = out["dead_rank_errors"]
    assert first[0] == "RankLost" and "\n" not in first[1]
    assert first[1].startswith("rank 1 (exited with code") and "restart the command" in first[1]
    assert second == first  # later jobs are refused at once with the same line


def test_check_full_mode_on_two_ranks_is_identical(tmp_path):
    done = subprocess.run([sys.executable, "-m", "h3app", "check", "--mode", "full", "--ulysses", "2",
                           "--adapter", ADAPTER, "--steps", "2", "--json"], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    assert result["parallel"] == "ulysses 2"
    assert result["identical"] is True and result["control_identical"] is True
    assert result["fallback_max_abs_diff"] > 0  # the comparison can tell settings apart
