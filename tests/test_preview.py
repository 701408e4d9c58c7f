"""Step previews (issue 36): x̂₀ formed as the scheduler forms it, decoded after every evaluation; the result never
changes; the last preview is the final video; the CLI writes DIR/step-K.png; check and grid write one folder per
column / cell; a cancel keeps the previews so far; a failing preview never fails the run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_runner import assert_one_line, run_cli
from PIL import Image

from h3app.backend.generation import Cancelled, run_generation
from h3app.backend.preview import Preview, PreviewBoard, clean_estimate, read_layout, strip, waveform_band
from h3app.errors import H3AppError
from h3app.lora.evaluations import EvaluationListener
from h3app.model import latent_rgb, preview_decoders
from h3app.model.preview_decoders import picked
from h3app.request import GenerationRequest
from h3app.settings import LoRASettings

ROOT = Path(__file__).resolve().parents[1]
TURBO = str(ROOT / "assets" / "adapters" / "lightx2v_turbo_no_alpha.safetensors")
PROMPT = "a red ball moving left over a grey floor"


def final_strip(video: np.ndarray) -> np.ndarray:
    """The strip a preview of the final video's first, middle and last frames would be (no waveform)."""
    return strip(video[picked(video.shape[0])], None)


def grey_r(preview: np.ndarray, reference: np.ndarray) -> float:
    return latent_rgb.grey_correlation(preview[:reference.shape[0]].astype(float), reference.astype(float))


class Estimates(EvaluationListener):
    """Records each evaluation's x̂₀ and its input latents (what the test compares against the scheduler)."""

    def __init__(self, pipe) -> None:
        self.pipe, self.seen = pipe, []

    def evaluated(self, evaluation, inputs, output) -> None:
        layout = read_layout(inputs, self.pipe.patch_size, int(self.pipe.audio_channels))
        video, audio = clean_estimate(inputs, output, layout)
        self.seen.append((evaluation, inputs["hidden_states"][0, -layout.video_rows:].clone(), video.clone(),
                          audio.clone()))


REQUEST = GenerationRequest(prompt=PROMPT, seed=4, steps=3)


@pytest.fixture(scope="module")
def plain(tiny_model):
    """REQUEST run without previews."""
    return run_generation(tiny_model.pipeline("t2va"), REQUEST)


@pytest.mark.slow
def test_previews_never_change_the_result_and_the_last_is_the_final_video(tiny_model, plain):
    pipe, request = tiny_model.pipeline("t2va"), REQUEST
    board = PreviewBoard(decoder="vae", audio=True)  # the audio band too: every decode the preview can run
    watched = run_generation(pipe, request, listeners=(board.listener(pipe),))
    assert watched.hash == plain.hash
    previews = board.history()
    assert [p.step for p in previews] == list(range(1, watched.evaluations + 1))
    assert all(p.count == watched.evaluations and p.audio and p.decoder == "vae" for p in previews)
    reference = final_strip(watched.video)
    assert grey_r(previews[-1].image, reference) > 0.999  # x̂₀ at the last evaluation is the final latent
    assert previews[-1].image.shape[0] > reference.shape[0]  # the waveform band below the frames
    for decoder in ("latent2rgb", "pca"):  # the other decoders leave the result alone too
        board = PreviewBoard(decoder=decoder, audio=False)
        assert run_generation(pipe, request, listeners=(board.listener(pipe),)).hash == plain.hash
        assert len(board.history()) == watched.evaluations
        if decoder == "latent2rgb":  # the fitted factors are faithful: the last preview looks like the video
            assert grey_r(board.latest().image, reference) > 0.9


@pytest.mark.slow
def test_the_estimate_uses_the_schedulers_sign_and_is_the_final_latent_at_the_end(tiny_model):
    pipe = tiny_model.pipeline("t2va")
    estimates = Estimates(pipe)
    decoded = []
    original = pipe.vae.decode  # the pipeline's decode of the final latents, captured
    pipe.vae.decode = lambda z, **kw: (decoded.append(z.clone()), original(z, **kw))[1]
    try:
        run_generation(pipe, GenerationRequest(prompt=PROMPT, seed=1, steps=4), listeners=(estimates,))
    finally:
        del pipe.vae.decode
    config = pipe.vae.config
    mean = torch.tensor(config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(config.latents_std).view(1, -1, 1, 1, 1)
    last = estimates.seen[-1][2]
    assert torch.equal(last * std + mean, decoded[-1])  # σ_next = 0: the scheduler's last step returns x̂₀
    # Between steps the scheduler blends: x_next = r·x + (1 − r)·x̂₀ with r = σ_next / σ (x̂₀ = x + σ·v, a +).
    for (evaluation, x, video, _), (_, x_next, _, _) in zip(estimates.seen, estimates.seen[1:]):
        r = evaluation.sigma_next / evaluation.sigma
        layout_rows = x.reshape(-1)
        blended = r * layout_rows + (1 - r) * _rows(video, pipe.patch_size).reshape(-1)
        assert torch.allclose(blended, x_next.reshape(-1), atol=1e-5)


def _rows(video: torch.Tensor, patch) -> torch.Tensor:
    """``(1, C, L, h, w)`` latents packed back into rows (the pipeline's patchify), to compare with its inputs."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import patchify_video_latents

    return patchify_video_latents(video, tuple(patch))


def test_the_tiny_models_latent2rgb_factors_are_fitted_for_its_vae(tiny_model):
    pipe = tiny_model.pipeline("t2va")
    factors = latent_rgb.load(latent_rgb.vae_fingerprint(dict(pipe.vae.config)))
    assert factors is not None and factors.model == "tiny" and factors.channels == pipe.vae.config.latent_channels
    assert factors.correlation > 0.9  # held out by the refit script
    assert latent_rgb.load(latent_rgb.vae_fingerprint({**dict(pipe.vae.config), "latent_channels": 24})) is None


def test_the_refit_recovers_a_known_linear_map():
    rng = np.random.default_rng(0)
    weights, bias = rng.normal(size=(6, 3)), np.array([0.5, 0.4, 0.3])
    x = rng.normal(size=(400, 6))
    w, b = latent_rgb.fit(x, x @ weights + bias)
    assert np.allclose(w, weights) and np.allclose(b, bias)
    video = rng.random((9, 8, 12, 3)).astype(np.float32)
    pooled = latent_rgb.pooled_frames(video, (3, 2, 3))
    assert pooled.shape == (3, 2, 3, 3)
    assert np.allclose(pooled[1, 0, 0], video[4, :4, :4].mean(axis=(0, 1)))  # frame 4 of 9 is latent frame 1 of 3


def test_pca_false_colours_and_the_auto_choice(tiny_model):
    pipe = tiny_model.pipeline("t2va")
    assert preview_decoders.build(pipe).video.name == "vae"  # the tiny VAE is small: its own decoder
    frames = preview_decoders.PCAFrames().frames(torch.randn(1, 24, 5, 6, 10))
    assert frames.shape == (3, 6, 10, 3) and 0 <= frames.min() and frames.max() <= 1 and frames.std() > 0.1
    with pytest.raises(H3AppError, match="preview decoder must be one of"):
        PreviewBoard(decoder="taesd")


@pytest.mark.slow
def test_a_failing_preview_stops_previews_not_the_run(tiny_model, plain, monkeypatch):
    pipe, request = tiny_model.pipeline("t2va"), REQUEST
    board = PreviewBoard(decoder="pca", audio=False)
    listener = board.listener(pipe)
    monkeypatch.setattr(listener.decoders.video, "frames", lambda latents: 1 / 0)
    assert run_generation(pipe, request, listeners=(listener,)).hash == plain.hash
    assert board.history() == [] and "previews stopped at step 1: ZeroDivisionError" in board.notes()[0]


@pytest.mark.slow
def test_the_check_previews_its_three_columns_side_by_side(backend, tmp_path):
    board = PreviewBoard(tmp_path / "check", decoder="pca", audio=False)
    seen = []
    result = backend.check_equivalence(GenerationRequest(prompt="a lighthouse", steps=3), LoRASettings(source=TURBO),
                                       previews=board, on_step=lambda *_: seen.append(board.aligned(("A", "B",
                                                                                                       "fallback"))))
    assert result.identical
    for column in ("A", "B", "fallback"):
        assert sorted(p.name for p in (tmp_path / "check" / column).iterdir()) == ["step-1.png", "step-2.png"]
        assert [p.step for p in board.history(column)] == [1, 2]
    assert np.array_equal(board.latest("A").image, board.latest("B").image)  # identical settings, same pictures
    assert not np.array_equal(board.latest("A").image, board.latest("fallback").image)  # 16× stronger
    aligned = board.aligned(("A", "B", "fallback"))
    assert {c: p.step for c, p in aligned.items()} == {"A": 2, "B": 2, "fallback": 2}


@pytest.mark.slow
def test_the_grid_previews_each_cell_and_baseline_in_its_folder(backend, tmp_path):
    board = PreviewBoard(tmp_path / "grid", decoder="pca", audio=False)
    plan = backend.plan_grid([8.0], [1.0], [0])
    cells = list(backend.grid(GenerationRequest(prompt="a grid of previews", steps=3), LoRASettings(source=TURBO),
                              plan, previews=board))
    assert len(cells) == 1
    assert sorted(p.name for p in (tmp_path / "grid").iterdir()) == ["alpha8-scale1-seed0", "baseline-seed0"]
    assert board.summary()["columns"] == {"alpha8-scale1-seed0": 2, "baseline-seed0": 2}


def test_aligned_shows_the_running_columns_step_in_every_column():
    board = PreviewBoard()
    image = np.zeros((2, 2, 3), np.uint8)
    for column, steps in (("fallback", (1, 2, 3)), ("A", (1,))):
        for step in steps:
            board.put(Preview(column, step, 3, image, "pca", False, 0.0, 1.0))
    aligned = board.aligned(("A", "B", "fallback"))
    assert {c: p.step for c, p in aligned.items()} == {"A": 1, "fallback": 1}  # the fallback at A's step
    assert board.aligned(("B",)) == {}


def test_waveform_band_draws_each_channel_in_its_lane():
    audio = np.zeros((2, 1000), np.float32)
    audio[0, :500] = 0.9  # left channel loud in its first half, right channel silent
    band = waveform_band(audio, width=50, height=40)
    lit = (band != band[0, -1]).any(axis=-1)
    assert lit[:20, :25].sum() > lit[:20, 25:].sum() > 0  # the loud half reaches far from the middle line
    assert lit[20:].sum() == lit[20:, :].any(axis=0).sum()  # silence: one pixel per column on the middle line


@pytest.mark.slow
def test_cli_generate_writes_one_png_per_evaluation_matching_the_video(capsys, tmp_path):
    out, folder = tmp_path / "run.mp4", tmp_path / "previews"
    done = run_cli(capsys, "generate", "--model", "tiny", "--steps", "8", "--prompt", PROMPT, "--preview-dir",
                   str(folder), "--out", str(out), "--json")
    assert done.code == 0, done.err
    result = json.loads(done.out)
    assert result["evaluations"] == 7 and result["previews"]["files"] == 7
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"step-{k}.png" for k in range(1, 8))
    import av

    with av.open(str(out)) as container:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)]).astype(np.float32) / 255
    last = np.asarray(Image.open(folder / "step-7.png"))
    assert grey_r(last, final_strip(frames)) > 0.95  # the mp4 is lossy; the preview is the final video's frames


def test_cli_check_previews_need_full_mode(capsys, tmp_path):
    done = run_cli(capsys, "check", "--model", "tiny", "--adapter", TURBO, "--preview-dir", str(tmp_path))
    assert done.code == 2
    assert_one_line(done.err, "--preview-dir needs --mode full")


@pytest.mark.slow
def test_watching_a_job_sees_each_preview_and_a_cancel_keeps_the_last(backend):
    from h3app.backend.preview import watch

    board = PreviewBoard(decoder="pca", audio=False)
    handle = backend.submit_generate(GenerationRequest(prompt=PROMPT, steps=6), previews=board)
    seen = []
    for progress in watch(handle, board, poll=0.05):
        latest = board.latest()
        seen.append(latest.step if latest else 0)
        assert progress.total in (0, 5) and progress.done <= 5  # this job's progress: 6 steps, 5 evaluations
        if latest is not None and latest.step == 2:
            handle.cancel()
    with pytest.raises(Cancelled, match=r"after [23] of 5 steps") as stopped:
        handle.result()
    assert seen == sorted(seen) and 1 in seen and 2 in seen  # each step's preview was seen while it ran
    assert board.latest().step == stopped.value.done  # the last preview is the last step run: it stays shown


def test_a_running_check_sends_each_preview_image_to_the_page_once():
    """An unchanged preview is ``gr.skip()`` on the next tick and at the end (``SentImages``): Gradio rewrites a
    numpy image's cache file each time it is sent, and a rewrite while the page reads it broke the image."""
    import gradio as gr

    from h3app.backend.worker import Progress
    from h3app.ui.generate.preview_stream import CheckPreviews, SentImages, check_finished, check_update

    board, parts, sent = PreviewBoard(), CheckPreviews("a", "b", "fallback", "note"), SentImages()
    running = Progress(1, 3, "denoising")
    board.put(Preview("fallback", 1, 3, np.zeros((2, 2, 3), np.uint8), "pca", False, 0.0, 1.0))
    first = sent.only_new(check_update(parts, board, running))
    again = sent.only_new(check_update(parts, board, running))
    assert isinstance(first["fallback"], np.ndarray) and first["a"] is None
    assert again["fallback"] == gr.skip() and again["a"] is None and again["note"] == first["note"]
    board.put(Preview("fallback", 2, 3, np.ones((2, 2, 3), np.uint8), "pca", False, 0.0, 1.0))
    newer = sent.only_new(check_update(parts, board, running))
    assert isinstance(newer["fallback"], np.ndarray) and newer["fallback"].max() == 1  # a new step: sent
    stopped = sent.only_new(check_finished(parts, board, stopped=True))
    assert stopped["fallback"] == gr.skip() and "Stopped" in stopped["note"]  # kept on screen, not re-sent
