"""End-to-end generate on the tiny checkpoint: mp4 with h264 + stereo AAC, seeded and deterministic."""

import json
from pathlib import Path

import numpy as np
import pytest
from cli_runner import assert_one_line, run_cli

from h3app.backend import media
from h3app.backend.generation import Cancelled, count_evaluations, run_generation
from h3app.errors import H3AppError
from h3app.request import GenerationRequest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_cli_generate_json_and_mp4(tmp_path, capsys):
    """The command in-process (a real ``python -m h3app generate`` runs in tests/test_model_repo.py)."""
    out = tmp_path / "x.mp4"
    done = run_cli(capsys, "generate", "--model", "tiny", "--prompt", "a fox in snow", "--seed", "7", "--steps", "5",
                   "--out", str(out), "--json")
    assert done.code == 0, done.err
    result = json.loads(done.out)
    for key in ("out", "seed", "steps", "evaluations", "frames", "fps", "width", "height", "sample_rate",
                "audio_channels", "hash", "adapters", "seconds"):
        assert key in result, key
    assert result["evaluations"] == 4 and result["steps"] == 5  # N sigma points → N−1 evaluations
    assert (result["frames"] - 5) % 17 == 0  # H3's 17n+5 rule
    info = media.probe_mp4(out)
    assert info.video_codec == "h264" and info.pix_fmt == "yuv420p"
    assert info.audio_codec == "aac" and info.audio_channels == 2 and info.sample_rate == result["sample_rate"]
    assert info.frames == result["frames"] and info.fps == 24
    assert abs(info.duration_s - result["frames"] / 24) < 0.2  # the soundtrack lasts as long as the video
    assert info.settings["hash"] == result["hash"] and info.settings["request"]["seed"] == 7


@pytest.mark.slow
def test_same_seed_identical_different_seed_differs(tiny_model):
    pipe = tiny_model.pipeline("t2va")
    a = run_generation(pipe, GenerationRequest(prompt="waves", seed=1, steps=3))
    b = run_generation(pipe, GenerationRequest(prompt="waves", seed=1, steps=3))
    c = run_generation(pipe, GenerationRequest(prompt="waves", seed=2, steps=3))
    assert a.hash == b.hash
    assert np.array_equal(a.video, b.video) and np.array_equal(a.audio, b.audio)
    assert a.hash != c.hash and not np.array_equal(a.video, c.video)
    assert a.audio.shape[0] == 2 and a.audio.shape[1] == round(a.frames / 24 * 40) * 800  # 40 audio latents/s, hop 800


@pytest.mark.slow
def test_progress_counts_evaluations_and_cancel_stops(tiny_model):
    pipe = tiny_model.pipeline("t2va")
    seen = []
    result = run_generation(pipe, GenerationRequest(prompt="birds", seed=0, steps=6),
                            on_step=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (5, 5) and [d for d, _ in seen[:-1]] == [0, 1, 2, 3, 4]
    assert result.evaluations == 5 == count_evaluations(6, 12.0)
    with pytest.raises(Cancelled):
        run_generation(pipe, GenerationRequest(prompt="birds", seed=0, steps=6),
                       should_cancel=lambda: len(seen) > 7, on_step=lambda d, t: seen.append((d, t)))
    again = run_generation(pipe, GenerationRequest(prompt="birds", seed=0, steps=6))
    assert again.hash == result.hash  # a cancel leaves nothing behind


@pytest.mark.slow
def test_shift_changes_output(tiny_model):
    pipe = tiny_model.pipeline("t2va")
    a = run_generation(pipe, GenerationRequest(prompt="x y", seed=0, steps=3))
    b = run_generation(pipe, GenerationRequest(prompt="x y", seed=0, steps=3, shift=3.0))
    c = run_generation(pipe, GenerationRequest(prompt="x y", seed=0, steps=3))
    assert a.hash != b.hash and a.hash == c.hash  # the override does not stick


@pytest.mark.parametrize("fields, message", [
    ({"prompt": ""}, "prompt is empty"),
    ({"duration": 2}, "duration"),
    ({"steps": 1}, "steps"),
    ({"height": 64}, "both"),
    ({"shift": -1.0}, "shift"),
    ({"workflow": "t2i"}, "workflow"),
])
def test_bad_requests(fields, message):
    with pytest.raises(H3AppError, match=message):
        GenerationRequest(**{"prompt": "ok", **fields})


def test_canvas_not_a_multiple(tiny_model):
    with pytest.raises(H3AppError, match="multiple of 8"):
        run_generation(tiny_model.pipeline("t2va"), GenerationRequest(prompt="x", height=60, width=64, steps=2))


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    """In-process (tests/test_architecture.py runs such refusals in a fresh process: no torch imported)."""
    done = run_cli(capsys, "generate", "--prompt", "x", "--duration", "1", "--out", str(tmp_path / "x.mp4"))
    assert done.code == 2 and not (tmp_path / "x.mp4").exists()
    assert_one_line(done.err, "--duration must be between")


@pytest.mark.slow
def test_fused_qkv_load_option_matches_unfused(tiny_model):
    from h3app.model.loader import LoadOptions, load_model

    fused = load_model("tiny", "t2va", LoadOptions(fuse_qkv=True))
    attn = fused.transformer().transformer_blocks[0].attn
    assert hasattr(attn, "to_qkv") and not hasattr(attn, "to_q")  # split weights freed
    request = GenerationRequest(prompt="a drum solo", seed=5, steps=3)
    a = run_generation(tiny_model.pipeline("t2va"), request)
    b = run_generation(fused.pipeline("t2va"), request)
    np.testing.assert_allclose(a.video, b.video, atol=1e-4)
    np.testing.assert_allclose(a.audio, b.audio, atol=1e-4)
