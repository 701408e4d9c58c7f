"""Difference metrics on known signals."""

import math

import numpy as np
import pytest

from h3app.backend import metrics


def test_psnr_known_value_and_identity():
    a = np.zeros((2, 4, 4, 3), np.float32)
    b = a + 0.1
    assert metrics.psnr(a, b) == pytest.approx(20.0)  # 10·log10(1 / 0.01)
    assert metrics.psnr(a, a) == math.inf
    assert metrics.per_frame_psnr(a, b) == pytest.approx([20.0, 20.0])


def test_snr_known_value():
    t = np.linspace(0, 1, 32000, dtype=np.float32)
    signal = np.stack([np.sin(2 * np.pi * 440 * t)] * 2)
    noisy = signal * 1.1  # noise = 0.1·signal → SNR 20 dB
    assert metrics.snr(signal, noisy) == pytest.approx(20.0, abs=1e-3)
    assert metrics.snr(signal, signal) == math.inf


def test_difference_maps_locate_the_change(tmp_path):
    a = np.zeros((3, 8, 8, 3), np.float32)
    b = a.copy()
    b[:, 2, 5, :] = 1.0
    diff = metrics.video_difference_map(a, b)
    assert diff.shape == (8, 8) and np.unravel_index(diff.argmax(), diff.shape) == (2, 5)
    rgb = metrics.colorize(diff)
    assert rgb.shape == (8, 8, 3) and tuple(rgb[2, 5]) == (252, 255, 164) and tuple(rgb[0, 0]) == (0, 0, 4)
    assert metrics.save_image(rgb, tmp_path / "d.png").stat().st_size > 0


def test_spectrogram_difference_sees_a_tone():
    t = np.linspace(0, 1, 32000, endpoint=False, dtype=np.float32)
    quiet = np.zeros((2, 32000), np.float32)
    tone = np.stack([0.5 * np.sin(2 * np.pi * 1000 * t)] * 2).astype(np.float32)
    diff = metrics.spectrogram_difference(quiet, tone)
    freq_bin = diff.shape[0] - 1 - round(1000 / (32000 / 1024))  # flipped: low frequencies at the bottom
    assert diff.mean(axis=1).argmax() == pytest.approx(freq_bin, abs=1)
    assert metrics.spectrogram_difference(tone, tone).max() == 0.0


def test_compare_reports_identical_and_shape_mismatch():
    v = np.random.RandomState(0).rand(2, 4, 4, 3).astype(np.float32)
    a = np.random.RandomState(1).rand(2, 100).astype(np.float32)
    same = metrics.compare(v, a, v.copy(), a.copy())
    assert same.identical and same.video_max_abs_diff == 0.0 and same.to_json()["video_psnr"] == "inf"
    other = metrics.compare(v, a, v * 0.5, a)
    assert not other.identical and other.video_max_abs_diff > 0
    with pytest.raises(ValueError, match="shape"):
        metrics.compare(v, a, v[:1], a)
