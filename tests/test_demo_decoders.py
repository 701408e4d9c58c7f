"""The committed checkpoint's VAE decoders paint and sound the data set's designed latents."""

import numpy as np
import pytest
import torch

from h3app.model.tiny_training import scenes, sound


def spectral_centroid(audio: np.ndarray, sample_rate: int) -> float:
    """Power-weighted mean frequency (Hz) of ``audio`` (``[..., samples]``, channels averaged)."""
    mono = np.asarray(audio, dtype=np.float64).reshape(-1, np.shape(audio)[-1]).mean(axis=0)
    mono = mono - mono.mean()
    power = np.abs(np.fft.rfft(mono * np.hanning(mono.size))) ** 2
    freqs = np.fft.rfftfreq(mono.size, 1.0 / sample_rate)
    return float((power * freqs).sum() / max(power.sum(), 1e-20))


def rms(audio: np.ndarray) -> float:
    """Root mean square of ``audio``."""
    return float(np.sqrt(np.mean(np.square(np.asarray(audio, dtype=np.float64)))))


def _decode_video(model, latents: np.ndarray) -> np.ndarray:
    pipe = model.pipeline("t2va")
    vae = model.components["vae"]
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        pixels = vae.decode(torch.from_numpy(latents)[None] * std + mean, return_dict=False)[0]
    pixels = pixels * torch.tensor(pipe.pixel_std).view(1, 3, 1, 1, 1) + torch.tensor(pipe.pixel_mean).view(1, 3, 1, 1, 1)
    return pixels.clamp(0, 1)[0].permute(1, 2, 3, 0).numpy()


def test_video_decoder_paints_the_designed_latents(tiny_model):
    words = scenes.PromptWords("red", "left", "sand", "low", "soft")
    frames, coverage = scenes.render(scenes.scene_for(words, np.random.default_rng(0)), 124)
    decoded = _decode_video(tiny_model, scenes.video_latents(frames, coverage))
    assert decoded.shape == frames.shape
    assert np.abs(decoded - frames).mean() < 0.25 * frames.std()
    # blocks of 4×4 pixels: the ball's centre block is red, a corner block is sand
    assert decoded[0, 14:18, 26:30, 0].mean() > 0.7 and decoded[0, 14:18, 26:30, 2].mean() < 0.3
    assert np.allclose(decoded[0, :4, :4].mean(axis=(0, 1)), frames[0, :4, :4].mean(axis=(0, 1)), atol=0.05)


@pytest.mark.slow
def test_audio_decoder_sounds_low_and_high_words_apart(tiny_model):
    audio_vae = tiny_model.components["audio_vae"]
    rate = int(audio_vae.config.sampling_rate)
    results = {}
    for pitch in sound.PITCH_CHANNEL:
        for loudness in sound.LOUDNESS_LEVEL:
            rows = sound.audio_rows(pitch, loudness, 40)
            with torch.no_grad():
                audio = audio_vae.decode(rows.reshape(2, 40, -1).permute(0, 2, 1), return_dict=False)[0][:, 0].numpy()
            results[pitch, loudness] = (spectral_centroid(audio, rate), rms(audio))
    for loudness in sound.LOUDNESS_LEVEL:
        assert 2 * results["low", loudness][0] < results["high", loudness][0], results
    for pitch in sound.PITCH_CHANNEL:
        assert results[pitch, "soft"][1] * 2 < results[pitch, "loud"][1], results
