"""Step-preview decoders: a clean-sample estimate's video latents → a few small frames; its audio → a waveform.

Three video decoders, the first that applies (``choose``):

- ``vae``: the model's own video VAE, when it is small (:data:`SMALL_VAE_PARAMETERS`: the tiny checkpoint's). Its
  preview at the last evaluation *is* the final video.
- ``latent2rgb``: the linear latent → RGB factors fitted for this VAE (``model/latent_rgb.py``): one small matmul
  per latent pixel of three latent frames (first, middle, last); colours of 16 × 16-pixel blocks.
- ``pca``: no factors for this VAE: the three principal directions of the latents' channels, stretched to [0, 1] —
  the right shapes and motion in false colours (refit the factors to get true ones).

The audio preview decodes the audio estimate with the model's own audio VAE (:class:`AudioWaveform`); whether that
is cheap enough is measured by the caller against the step it follows (``h3app.backend.preview``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from ..errors import H3AppError
from ..rules.choices import PREVIEW_DECODERS as DECODERS
from ..rules.choices import PREVIEW_LATENT2RGB as LATENT2RGB
from ..rules.choices import PREVIEW_PCA as PCA
from ..rules.choices import PREVIEW_VAE as VAE
from . import latent_rgb

SMALL_VAE_PARAMETERS = 10_000_000  # below this the real decoder is cheap (tiny: 36 k parameters, ~0.4 s on a CPU)


class FrameDecoder(Protocol):
    """Latents ``(1, C, L, h, w)`` (normalised, as the denoiser makes them) → the first, middle and last frames
    ``[3, H, W, 3]`` float32 in [0, 1] on the host."""

    name: str

    def frames(self, latents: torch.Tensor) -> np.ndarray: ...


def picked(count: int) -> list[int]:
    """First, middle and last of ``count`` frames (fewer when there are fewer)."""
    return sorted({0, count // 2, count - 1})


def host(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` as a float32 host array (the one copy a preview makes off the GPU)."""
    return tensor.detach().to("cpu", torch.float32).numpy()


@dataclass
class VAEFrames:
    """The model's own video VAE: denormalise, decode, undo the ImageNet normalisation (as the pipeline does)."""

    vae: Any
    pixel_mean: tuple[float, ...]
    pixel_std: tuple[float, ...]
    name: str = VAE

    def frames(self, latents: torch.Tensor) -> np.ndarray:
        config = self.vae.config
        shape = (1, -1, 1, 1, 1)
        mean = torch.tensor(config.latents_mean, device=latents.device).view(shape)
        std = torch.tensor(config.latents_std, device=latents.device).view(shape)
        # The class's decode: a preview runs on rank 0 alone, never the ranks' shared decode (parallel/decode.py).
        decode = type(self.vae).decode
        video = decode(self.vae, (latents.float() * std + mean).to(self.vae.dtype), return_dict=False)[0]
        pixel_mean = torch.tensor(self.pixel_mean, device=video.device).view(shape)
        pixel_std = torch.tensor(self.pixel_std, device=video.device).view(shape)
        video = (video.float() * pixel_std + pixel_mean).clamp(0, 1)[0]  # (3, F, H, W)
        return host(video[:, picked(video.shape[1])].permute(1, 2, 3, 0))


@dataclass
class LinearFrames:
    """Fitted latent → RGB factors, on three latent frames."""

    factors: latent_rgb.LatentRGB
    name: str = LATENT2RGB

    def frames(self, latents: torch.Tensor) -> np.ndarray:
        chosen = latents[0][:, picked(latents.shape[2])]  # (C, 3, h, w)
        return host(self.factors.project(chosen).permute(1, 2, 3, 0))


@dataclass
class PCAFrames:
    """False colours: the three principal directions of the channels over the three frames, each stretched between
    its 1st and 99th percentile; signs fixed so that a direction's largest loading is positive (less flicker)."""

    name: str = PCA

    def frames(self, latents: torch.Tensor) -> np.ndarray:
        chosen = latents[0][:, picked(latents.shape[2])].float()  # (C, 3, h, w)
        flat = chosen.reshape(chosen.shape[0], -1)
        centred = flat - flat.mean(dim=1, keepdim=True)
        _, vectors = torch.linalg.eigh(centred @ centred.T)  # ascending eigenvalues: the last three lead
        leading = vectors[:, -3:].flip(-1)
        signs = torch.sign(leading.gather(0, leading.abs().argmax(dim=0, keepdim=True)))
        projected = (leading * torch.where(signs == 0, torch.ones_like(signs), signs)).T @ centred  # (3, N)
        low = torch.quantile(projected, 0.01, dim=1, keepdim=True)
        high = torch.quantile(projected, 0.99, dim=1, keepdim=True)
        rgb = ((projected - low) / (high - low).clamp_min(1e-6)).clamp(0, 1)
        return host(rgb.reshape(3, *chosen.shape[1:]).permute(1, 2, 3, 0))


@dataclass
class AudioWaveform:
    """The model's own audio VAE on the audio estimate ``(2, C, L)`` (normalised) → ``[2, samples]`` in [-1, 1].
    ``share``: the measured cost of a whole decode over the step it followed (None until measured, once per loaded
    model); ``note``: why the audio preview is off, when it is."""

    vae: Any
    share: float | None = None
    note: str | None = None

    def waveform(self, latents: torch.Tensor) -> np.ndarray:
        config = self.vae.config
        mean = torch.tensor(config.latents_mean, device=latents.device).view(1, -1, 1)
        std = torch.tensor(config.latents_std, device=latents.device).view(1, -1, 1)
        audio = self.vae.decode(latents.float() * std + mean, return_dict=False)[0]  # (2, 1, samples)
        return host(audio[:, 0])


@dataclass(frozen=True)
class Decoders:
    """One pipeline's preview decoders (the audio one shared by every kind of video decoder of that pipeline)."""

    video: FrameDecoder
    audio: AudioWaveform | None
    factors: latent_rgb.LatentRGB | None = None


def parameters(module: Any) -> int:
    return sum(p.numel() for p in module.parameters()) if isinstance(module, torch.nn.Module) else 0


def build(pipe: Any, kind: str = "auto") -> Decoders:
    """The decoders for ``pipe`` (its ``vae`` / ``audio_vae``): ``kind`` one of :data:`DECODERS`."""
    vae = pipe.vae
    factors = latent_rgb.load(latent_rgb.vae_fingerprint(dict(vae.config)))
    if kind == "auto":
        kind = VAE if parameters(vae) <= SMALL_VAE_PARAMETERS else LATENT2RGB if factors is not None else PCA
    if kind == VAE:
        video: FrameDecoder = VAEFrames(vae, tuple(pipe.pixel_mean), tuple(pipe.pixel_std))
    elif kind == LATENT2RGB:
        if factors is None:
            raise H3AppError("no latent→RGB factors were fitted for this model's VAE: run "
                             "`python scripts/fit_latent_rgb.py --model NAME` once, or use the pca preview.")
        video = LinearFrames(factors)
    elif kind == PCA:
        video = PCAFrames()
    else:
        raise H3AppError(f"the preview decoder must be one of {', '.join(DECODERS)}, got {kind!r}.")
    return Decoders(video=video, audio=audio_decoder(pipe), factors=factors)


_AUDIO: weakref.WeakKeyDictionary[torch.nn.Module, AudioWaveform] = weakref.WeakKeyDictionary()
_BUILT: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, Decoders]] = weakref.WeakKeyDictionary()


def audio_decoder(pipe: Any) -> AudioWaveform | None:
    """``pipe``'s audio VAE as a waveform decoder, one per loaded audio VAE (its cost is measured once)."""
    vae = getattr(pipe, "audio_vae", None)
    if not isinstance(vae, torch.nn.Module):
        return None
    if vae not in _AUDIO:
        _AUDIO[vae] = AudioWaveform(vae)
    return _AUDIO[vae]


def for_pipeline(pipe: Any, kind: str = "auto") -> Decoders:
    """:func:`build`, once per VAE and kind."""
    per_vae = _BUILT.setdefault(pipe.vae, {})
    if kind not in per_vae:
        per_vae[kind] = build(pipe, kind)
    return per_vae[kind]
