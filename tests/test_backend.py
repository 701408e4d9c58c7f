"""Backend: jobs carry their own adapter settings; progress, cancel, equivalence, grid, workflows, presets."""

import json
import threading
import wave
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_runner import assert_one_line, run_cli
from PIL import Image
from polling import wait_until

from h3app.backend import media
from h3app.backend.generation import Cancelled
from h3app.backend.presets import resolve_presets
from h3app.backend.service import Backend
from h3app.backend.worker import QueueFull, Worker
from h3app.errors import H3AppError
from h3app.request import GenerationRequest
from h3app.settings import LoRASettings

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = ROOT / "assets" / "adapters"
TURBO = str(ADAPTERS / "lightx2v_turbo_no_alpha.safetensors")
KOHYA = str(ADAPTERS / "kohya_musubi.safetensors")


def weights_digest(module: torch.nn.Module) -> dict[str, bytes]:
    return {name: t.detach().cpu().numpy().tobytes() for name, t in module.state_dict().items()}


@pytest.mark.slow
def test_interleaved_jobs_each_get_their_own_settings(backend):
    request = GenerationRequest(prompt="a lighthouse at night", seed=3, steps=3)
    settings_a = [LoRASettings(source=TURBO, alpha=8.0)]
    settings_b = [LoRASettings(source=TURBO, alpha=64.0), LoRASettings(source=KOHYA, strength=-0.5)]
    solo_a = backend.generate(request, settings_a).result.hash
    solo_b = backend.generate(request, settings_b).result.hash
    handles = [backend.submit_generate(request, s) for s in (settings_a, settings_b, settings_a, settings_b)]
    hashes = [h.result(timeout=600).result.hash for h in handles]
    assert hashes == [solo_a, solo_b, solo_a, solo_b]
    assert solo_a != solo_b


@pytest.mark.slow
def test_no_adapter_job_runs_on_the_bitwise_base(backend, tiny_model):
    backend.binder.reset()
    base = weights_digest(tiny_model.transformer())
    clean = backend.generate(GenerationRequest(prompt="p", seed=1, steps=2)).result.hash
    backend.generate(GenerationRequest(prompt="p", seed=1, steps=2), [LoRASettings(source=TURBO, mode="merged")])
    assert backend.generate(GenerationRequest(prompt="p", seed=1, steps=2)).result.hash == clean
    backend.binder.reset()
    assert weights_digest(tiny_model.transformer()) == base


@pytest.mark.slow
def test_progress_reports_n_minus_one_steps_and_cancel_leaves_next_job_clean(backend):
    seen = []
    request = GenerationRequest(prompt="rain", seed=5, steps=6)
    backend.generate(request, [LoRASettings(source=TURBO)], on_step=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1] == (5, 5)

    fresh = backend.generate(request, [LoRASettings(source=KOHYA)]).result.hash
    handle = backend.submit_generate(request, [LoRASettings(source=TURBO, alpha=32.0)])
    wait_until(lambda: handle.progress.done >= 2 or handle.done, "two steps of the job", wait=handle.wait_for_change)
    handle.cancel()
    with pytest.raises(Cancelled):
        handle.result(timeout=600)
    assert backend.generate(request, [LoRASettings(source=KOHYA)]).result.hash == fresh


@pytest.mark.slow
def test_failed_job_resets_to_base_and_worker_lives_on(backend, tiny_model):
    backend.binder.reset()
    base = weights_digest(tiny_model.transformer())
    with pytest.raises(H3AppError, match="does not exist|not found|no such"):
        backend.generate(GenerationRequest(prompt="x", steps=2),
                         [LoRASettings(source=TURBO), LoRASettings(source=str(ADAPTERS / "missing.safetensors"))])
    assert weights_digest(tiny_model.transformer()) == base
    assert backend.generate(GenerationRequest(prompt="x", steps=2)).result.frames > 0


@pytest.mark.slow
def test_mp4_has_video_stereo_audio_and_its_settings(backend):
    output = backend.generate(GenerationRequest(prompt="waves", seed=2, steps=2), [LoRASettings(source=TURBO, alpha=8)])
    info = media.probe_mp4(output.video_path)
    assert info.video_codec == "h264" and info.audio_channels == 2
    adapter = info.settings["adapters"][0]
    assert adapter["resolved_alpha"] == 8 and adapter["resolved_alpha_source"] == "explicit"
    assert len(adapter["sha256"]) == 64 and adapter["rank"] == 128
    assert info.settings["hash"] == output.result.hash
    assert Path(output.thumbnail_path).stat().st_size > 0


@pytest.mark.slow
def test_full_mode_equivalence_identical_and_fallback_differs(backend, tiny_model):
    backend.binder.reset()
    base = weights_digest(tiny_model.transformer())
    result = backend.check_equivalence(GenerationRequest(prompt="a boat", seed=0, steps=3),
                                       LoRASettings(source=TURBO))
    assert result.identical and result.control_identical
    assert result.a.hash == result.b.hash != result.fallback.hash
    assert result.a_vs_b.video_max_abs_diff == 0.0 and result.a_vs_fallback.video_max_abs_diff > 0
    assert result.a.effective_scale == pytest.approx(8 / 128) and result.fallback.effective_scale == 1.0
    assert len(result.a_vs_fallback.frame_psnr) == media.probe_mp4(result.a.video_path).frames
    b_file = media.probe_mp4(result.b.video_path)  # B's mp4 is A's streams, remuxed with B's own settings
    assert b_file.settings["alpha"] == 128.0 and b_file.settings["column"] == "B" and b_file.audio_channels == 2
    assert b_file.frames == media.probe_mp4(result.a.video_path).frames
    for path in (result.heatmap_path, result.spectrogram_diff_path, result.fallback_heatmap_path):
        assert Path(path).stat().st_size > 0
    assert weights_digest(tiny_model.transformer()) == base  # left at base


@pytest.mark.slow
def test_grid_yields_rows_times_columns(backend):
    plan = backend.plan_grid([8.0, None], [0.5, 1.0, -1.0], [0])
    assert plan.cells == 6
    cells = list(backend.grid(GenerationRequest(prompt="grid", steps=2), LoRASettings(source=TURBO), plan))
    assert [(c.row, c.column) for c in cells] == [(r, c) for r in range(2) for c in range(3)]
    assert len({c.hash for c in cells}) == 6 and all(c.baseline_psnr > 0 for c in cells)
    with pytest.raises(H3AppError, match="cells"):
        backend.plan_grid(list(range(1, 10)), [1.0] * 10, [0])


@pytest.mark.slow
def test_fl2va_and_ref2va_workflows(backend, tmp_path):
    image = tmp_path / "key.png"
    Image.fromarray((np.random.RandomState(0).rand(64, 96, 3) * 255).astype(np.uint8)).save(image)
    first = backend.generate(GenerationRequest(prompt="pan left", steps=2, workflow="fl2va", first_frame=str(image)))
    last = backend.generate(GenerationRequest(prompt="pan left", steps=2, workflow="fl2va", last_frame=str(image)))
    # the canvas takes the 2:3 keyframe's aspect at the model's short edge
    assert first.result.hash != last.result.hash and first.result.width == 3 * first.result.height // 2
    voice = tmp_path / "voice16k.wav"  # not at the audio VAE's 32 kHz: resampled with PyAV, no torchaudio needed
    t = np.arange(6 * 16000) / 16000
    with wave.open(str(voice), "wb") as out:
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(16000)
        out.writeframes((0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype(np.int16).tobytes())
    ref = backend.generate(GenerationRequest(prompt="the same object", steps=2, workflow="ref2va",
                                             references=(str(image), str(voice))))
    assert ref.result.frames > 0
    with pytest.raises(H3AppError, match="keyframe"):
        GenerationRequest(prompt="x", workflow="fl2va")
    with pytest.raises(H3AppError, match="reference"):
        GenerationRequest(prompt="x", workflow="ref2va")
    with pytest.raises(H3AppError, match="not an image, video or audio"):
        GenerationRequest(prompt="x", workflow="ref2va", references=(str(ROOT / "README.md"),))


def test_presets_fill_only_what_was_not_given():
    from h3app.adapters.known import find_known

    known = find_known("lightx2v/Minimax-h3-Turbo", "minimax_h3_t2v_turbo_4step_v0.1.safetensors")
    resolved = resolve_presets({"steps": None, "shift": 6.0, "audio_shift": None, "workflow": None}, known)
    assert resolved.fields == {"steps": 5, "shift": 6.0, "audio_shift": 3.0, "workflow": "t2va"}
    assert any("steps=5" in note for note in resolved.notes)
    assert resolve_presets({"steps": None, "shift": None, "audio_shift": None, "workflow": None}, None).fields["steps"] == 5


def test_worker_queue_bound_and_queued_cancel():
    release = threading.Event()
    worker = Worker(max_queue=1)
    try:
        running = worker.submit(lambda ctx: release.wait(10), "block")
        wait_until(lambda: worker.current is not None, "the worker to start the blocking job")
        queued = worker.submit(lambda ctx: "ran", "queued")
        with pytest.raises(QueueFull, match="queue is full"):
            worker.submit(lambda ctx: None, "overflow")
        queued.cancel()
        release.set()
        assert running.result(10) is True
        with pytest.raises(Cancelled):
            queued.result(10)
        assert worker.run(lambda ctx: 42, timeout=10) == 42
    finally:
        release.set()
        worker.close()


@pytest.mark.slow
def test_cli_check_full_mode_json(capsys):
    done = run_cli(capsys, "check", "--model", "tiny", "--adapter", TURBO, "--mode", "full", "--steps", "2", "--json")
    assert done.code == 0, done.err
    result = json.loads(done.out)
    assert result["mode"] == "full" and result["identical"] is True and result["control_identical"] is True
    assert result["hash_a"] == result["hash_b"] != result["hash_fallback"] and result["fallback_max_abs_diff"] > 0


@pytest.mark.slow
def test_cli_generate_two_adapters_and_registry_presets(tmp_path, capsys):
    # a file the registry knows, in a local HF cache layout: its preset (5 steps, shift 12) becomes the default
    snapshot = tmp_path / "hub" / "models--lightx2v--Minimax-h3-Turbo" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    known_file = snapshot / "minimax_h3_t2v_turbo_4step_v0.1.safetensors"
    known_file.write_bytes(Path(TURBO).read_bytes())
    out = tmp_path / "two.mp4"
    done = run_cli(capsys, "generate", "--prompt", "two adapters", "--adapter", str(known_file),
                   "--adapter-spec", f"{KOHYA},alpha=3,scale=0.5", "--out", str(out), "--json")
    assert done.code == 0, done.err
    result = json.loads(done.out)
    assert result["steps"] == 5 and result["evaluations"] == 4
    assert any("registry" in note for note in result["presets"])
    first, second = result["adapters"]
    assert first["resolved_alpha"] == 8.0 and first["resolved_alpha_source"] == "registry"
    assert second["resolved_alpha"] == 3.0 and second["strength"] == 0.5
    assert media.read_settings(out)["adapters"] == result["adapters"]
    bad = run_cli(capsys, "generate", "--prompt", "x", "--adapter-spec", "alpha=3", "--out", str(tmp_path / "b.mp4"))
    assert bad.code == 2 and not (tmp_path / "b.mp4").exists()
    assert_one_line(bad.err, "--adapter-spec must start with the source")


def test_inspect_and_load_a_hub_weight_at_a_revision(backend, tmp_path, fake_hub):
    main, tagged = tmp_path / "main", tmp_path / "v2"
    main.mkdir(), tagged.mkdir()
    (main / "a.safetensors").write_bytes(Path(TURBO).read_bytes())
    (main / "b.safetensors").write_bytes(Path(KOHYA).read_bytes())
    (tagged / "b.safetensors").write_bytes(Path(KOHYA).read_bytes())
    fake_hub.add_repo("someone/loras", main)
    commit = fake_hub.add_revision("someone/loras", "v2", tagged)
    info = backend.inspect("someone/loras", "a.safetensors", None)
    assert info.format == "peft" and info.rank == 128
    reads = fake_hub.requests_for("someone/loras", "a.safetensors")
    assert reads and not any(r.is_full_get for r in reads)  # header only: HTTP ranges, never the whole file
    assert backend.inspect("someone/loras", "b.safetensors", "v2").format == "kohya"
    loaded = backend.load(LoRASettings(source="someone/loras", weight_name="b.safetensors", revision="v2"))
    assert loaded.provenance["commit"] == commit and loaded.report.matched
    backend.binder.reset()


def test_resample_audio_keeps_duration_and_pitch():
    t = np.arange(16000) / 16000
    tone = np.stack([np.sin(2 * np.pi * 1000 * t)] * 2).astype(np.float32)
    up = media.resample_audio(tone, 16000, 32000)
    assert up.shape[0] == 2 and abs(up.shape[1] - 32000) <= 64
    spectrum = np.abs(np.fft.rfft(up[0, 1000:31000]))
    assert abs(np.argmax(spectrum) * 32000 / 30000 - 1000) < 5
    assert media.resample_audio(tone, 16000, 16000) is not None and np.array_equal(
        media.resample_audio(tone, 16000, 16000), tone)


def test_hosted_download_cache_is_trimmed_to_its_budget(tiny_model, tmp_path, fake_hub):
    from huggingface_hub import scan_cache_dir

    for repo_id, source in (("a/turbo", TURBO), ("b/kohya", KOHYA)):
        folder = tmp_path / repo_id.replace("/", "_")
        folder.mkdir()
        (folder / Path(source).name).write_bytes(Path(source).read_bytes())
        fake_hub.add_repo(repo_id, folder)
    budget = Path(TURBO).stat().st_size + Path(KOHYA).stat().st_size // 2  # room for one of the two
    hosted = Backend(loaded=tiny_model, hosted=True, output_dir=tmp_path / "out", max_download_cache_bytes=budget)
    try:
        hosted.load(LoRASettings(source="a/turbo"))
        assert {r.repo_id for r in scan_cache_dir().repos} == {"a/turbo"}
        hosted.load(LoRASettings(source="b/kohya"))
        cached = {r.repo_id: r.size_on_disk for r in scan_cache_dir().repos}
        assert set(cached) == {"b/kohya"} and sum(cached.values()) <= budget  # the older download was evicted
        assert hosted.generate(GenerationRequest(prompt="x", steps=2), [LoRASettings(source="b/kohya")]).result.frames
    finally:
        hosted.binder.reset()
        hosted.close()
