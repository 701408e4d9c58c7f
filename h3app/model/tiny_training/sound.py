"""Soundtracks for the data set: "low"/"high" pick an audio-latent channel, "soft"/"loud" its level.

The audio decoder turns channel ``PITCH_CHANNEL["low"]`` into a 200 Hz buzz and ``PITCH_CHANNEL["high"]`` into a
2 kHz square wave, at an amplitude proportional to the level (see :mod:`.decoders`).
"""

from __future__ import annotations

import torch

PITCH_CHANNEL = {"low": 1, "high": 6}
LOUDNESS_LEVEL = {"soft": 0.4, "loud": 1.2}


def audio_rows(pitch: str, loudness: str, num_latents: int, channels: int = 8, audio_channels: int = 2) -> torch.Tensor:
    """Normalised audio latents in the transformer's channel-major row layout ``[audio_channels × num_latents, C]``."""
    code = torch.zeros(channels)
    code[PITCH_CHANNEL[pitch]] = LOUDNESS_LEVEL[loudness]
    return code.view(1, 1, -1).expand(audio_channels, num_latents, channels).reshape(-1, channels).contiguous()
