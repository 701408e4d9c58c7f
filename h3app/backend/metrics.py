"""How different two outputs are: PSNR (video, per frame), audio SNR, difference heat-maps and spectrogram diffs.

Video arrays are ``[F, H, W, 3]`` float in [0, 1]; audio arrays are ``[channels, samples]`` float in [-1, 1].
Identical inputs give ``inf`` PSNR/SNR (reported as such, never as a large made-up number).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# A perceptually ordered black → purple → orange → yellow ramp (anchor points of matplotlib's "inferno").
_RAMP = np.array([[0, 0, 4], [40, 11, 84], [101, 21, 110], [159, 42, 99], [212, 72, 66], [245, 125, 21],
                  [250, 193, 39], [252, 255, 164]], dtype=np.float32)


def psnr(a: np.ndarray, b: np.ndarray, peak: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB over all elements (``inf`` when equal)."""
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return math.inf if mse == 0.0 else 10.0 * math.log10(peak * peak / mse)


def per_frame_psnr(a: np.ndarray, b: np.ndarray) -> list[float]:
    """PSNR of each frame pair, in dB."""
    return [psnr(fa, fb) for fa, fb in zip(a, b)]


def snr(reference: np.ndarray, other: np.ndarray) -> float:
    """Signal-to-noise ratio of ``other`` against ``reference`` in dB (``inf`` when equal)."""
    noise = float(np.sum((np.asarray(reference, np.float64) - np.asarray(other, np.float64)) ** 2))
    signal = float(np.sum(np.asarray(reference, np.float64) ** 2))
    if noise == 0.0:
        return math.inf
    return -math.inf if signal == 0.0 else 10.0 * math.log10(signal / noise)


def colorize(values: np.ndarray) -> np.ndarray:
    """Map a 2-D array to RGB uint8 through the ramp, scaled by its own maximum (all-zero → black)."""
    values = np.asarray(values, dtype=np.float32)
    top = float(values.max()) if values.size else 0.0
    scaled = values / top if top > 0 else np.zeros_like(values)
    position = scaled * (len(_RAMP) - 1)
    low = np.floor(position).astype(int).clip(0, len(_RAMP) - 1)
    high = (low + 1).clip(0, len(_RAMP) - 1)
    weight = (position - low)[..., None]
    return (_RAMP[low] * (1 - weight) + _RAMP[high] * weight).round().astype(np.uint8)


def video_difference_map(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[H, W]`` mean absolute difference over frames and colour channels."""
    return np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).mean(axis=(0, 3))


def log_spectrogram(audio: np.ndarray, n_fft: int = 1024, hop: int = 256) -> np.ndarray:
    """``[freq, time]`` log-magnitude (dB) STFT of the channel mean."""
    mono = torch.from_numpy(np.asarray(audio, np.float32).mean(axis=0))
    window = torch.hann_window(n_fft)
    spectrum = torch.stft(mono, n_fft=n_fft, hop_length=hop, window=window, return_complex=True).abs()
    return (20.0 * torch.log10(spectrum + 1e-7)).numpy()


def spectrogram_difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[freq, time]`` absolute difference of the two log spectrograms (dB), low frequencies at the bottom."""
    return np.abs(log_spectrogram(a) - log_spectrogram(b))[::-1]


def save_image(rgb: np.ndarray, path: str | Path, min_side: int = 128) -> Path:
    """Write an RGB uint8 image, upscaled with nearest-neighbour so that tiny canvases stay visible."""
    from PIL import Image

    image = Image.fromarray(rgb)
    if min(image.size) < min_side:
        factor = math.ceil(min_side / max(1, min(image.size)))
        image = image.resize((image.width * factor, image.height * factor), Image.Resampling.NEAREST)
    path = Path(path)
    image.save(path, compress_level=1)  # a noisy difference map took ~2× as long at PNG's default level 6
    return path


@dataclass(frozen=True)
class Difference:
    """A vs B: everything the equivalence tab shows besides the videos."""

    identical: bool
    video_max_abs_diff: float
    video_psnr: float
    frame_psnr: tuple[float, ...]
    audio_max_abs_diff: float
    audio_snr: float

    def to_json(self) -> dict:
        def finite(value: float) -> float | str:
            return value if math.isfinite(value) else ("inf" if value > 0 else "-inf")

        return {
            "identical": self.identical,
            "video_max_abs_diff": self.video_max_abs_diff,
            "video_psnr": finite(self.video_psnr),
            "frame_psnr": [finite(v) for v in self.frame_psnr],
            "audio_max_abs_diff": self.audio_max_abs_diff,
            "audio_snr": finite(self.audio_snr),
        }


def compare(video_a: np.ndarray, audio_a: np.ndarray, video_b: np.ndarray, audio_b: np.ndarray) -> Difference:
    """All scalar differences between two decoded outputs of the same shape."""
    if video_a.shape != video_b.shape or audio_a.shape != audio_b.shape:
        raise ValueError(f"outputs differ in shape: {video_a.shape}/{audio_a.shape} vs {video_b.shape}/{audio_b.shape}")
    identical = bool(np.array_equal(video_a, video_b) and np.array_equal(audio_a, audio_b))
    return Difference(
        identical=identical,
        video_max_abs_diff=float(np.max(np.abs(video_a - video_b))) if video_a.size else 0.0,
        video_psnr=psnr(video_a, video_b),
        frame_psnr=tuple(per_frame_psnr(video_a, video_b)),
        audio_max_abs_diff=float(np.max(np.abs(audio_a - audio_b))) if audio_a.size else 0.0,
        audio_snr=snr(audio_a, audio_b),
    )
