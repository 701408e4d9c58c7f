"""Small media helpers for presentation: pull the soundtrack of an mp4 into a WAV (for the A/B audio players) and
decode an mp4's frames (for comparing two history entries). Exact comparisons use the content hashes the backend
computes on the raw arrays; these decode the lossy mp4s and are labelled as such in the UI."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np


def extract_audio(mp4: str | Path, wav: str | Path) -> Path:
    """Decode the audio track of ``mp4`` to a 16-bit PCM WAV (channels kept) at ``wav``."""
    import av

    chunks: list[np.ndarray] = []
    rate, channels = 0, 0
    with av.open(str(mp4)) as container:
        stream = next(s for s in container.streams if s.type == "audio")
        rate = stream.codec_context.sample_rate
        for frame in container.decode(stream):
            samples = frame.to_ndarray()  # planar float: [channels, n]; packed: [1, n * channels]
            if frame.format.is_planar:
                chunks.append(samples.astype(np.float32))
            else:
                chunks.append(samples.reshape(-1, len(frame.layout.channels)).T.astype(np.float32))
    audio = np.concatenate(chunks, axis=1) if chunks else np.zeros((2, 0), np.float32)
    channels = audio.shape[0]
    pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").T.reshape(-1)
    wav = Path(wav)
    with wave.open(str(wav), "wb") as handle:
        handle.setnchannels(channels)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes(pcm.tobytes())
    return wav


def decode_video(mp4: str | Path) -> np.ndarray:
    """``[F, H, W, 3]`` float32 in [0, 1] from an mp4 (lossy: h264)."""
    import av

    with av.open(str(mp4)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    return np.stack(frames).astype(np.float32) / 255.0 if frames else np.zeros((0, 0, 0, 3), np.float32)
