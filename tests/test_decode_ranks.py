"""The video decode's tiles spread over 2 CPU ranks (gloo) give the frames of one process's tiled decode, bit for bit.

One run of ``tests/decode_ranks_driver.py --ulysses 2`` (both ranks run it) decodes seeded latents of the tiny video
VAE both ways: with the released tiles (one per clip at the tiny canvas, several clips), with small tiles (many per
clip, a padded tail), with one tile (rank 1 decodes nothing) and with the decoder in bf16 (``--vae-dtype``). Each
rank decodes only its share (counted by the decoder's real forwards); the two ranks' shares add up to one process's
tiles. The whole pipeline over 2 ranks (whose decode now goes this way) is tests/test_parallel_ranks.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from decode_ranks_driver import CASES  # noqa: E402

DRIVER = ROOT / "tests" / "decode_ranks_driver.py"
RUN_TIMEOUT_S = 600

pytestmark = [pytest.mark.slow, pytest.mark.timeout(RUN_TIMEOUT_S)]


@pytest.fixture(scope="module")
def decoded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("decode-ranks")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(folder / "hf-home"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(DRIVER), str(folder), "--ulysses", "2", "--parallel-timeout", "120"],
                          env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    return folder


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_decode_the_same_frames_bit_for_bit(decoded, case):
    arrays = np.load(decoded / f"{case}.npz")
    assert bool(arrays["same_bytes"])  # torch.equal on the decoders' own dtype, on rank 0
    assert arrays["one"].shape == arrays["spread"].shape and np.array_equal(arrays["one"], arrays["spread"])


@pytest.mark.parametrize("case", list(CASES))
def test_each_rank_decodes_its_share_of_the_tiles(decoded, case):
    counts = [json.loads((decoded / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    tiles = counts[0][f"{case}/one"]
    assert counts[1][f"{case}/one"] == tiles
    assert [count[case] for count in counts] == [(tiles + 1) // 2, tiles // 2]
    if case.startswith("small_tiles"):
        assert tiles > 2 * 3  # several tiles per clip, over more than one clip


def test_a_rank_that_fails_its_share_stops_every_rank_at_the_agreement(decoded):
    """Rank 1's decoder fails; rank 0 learns it at the agreement between the passes (not after a broadcast's
    timeout, 120 s here) and says which rank failed and why; rank 1 raises its own error."""
    leader, follower = (json.loads((decoded / f"rank-{rank}.json").read_text())["failure"] for rank in (0, 1))
    assert leader["raised"][0] == "PeerFailed" and "rank 1 failed" in leader["raised"][1]
    assert "injected decode fault on rank 1" in leader["raised"][1]
    assert follower["raised"] == ["RuntimeError", "injected decode fault on rank 1"]
    assert leader["seconds"] < 60
