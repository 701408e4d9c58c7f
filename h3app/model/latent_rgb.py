"""Latent → RGB factors: a linear projection from H3 video latents to colour, the cheapest preview decoder.

One latent pixel of the video VAE covers a block of pixels (16 × 16 × 4 frames on the released VAE); a linear map
``rgb = latentᵀ · W + b`` (``W``: channels × 3, ``b``: 3) gives each block's average colour well enough to see
what a denoising step is making. The factors are fitted here by least squares on the model's *own* decodes (its
generations' final latents against the frames its VAE decoded from them) — ``scripts/fit_latent_rgb.py`` collects
them and writes :data:`FACTORS_FILE` — never copied from another project. Latents are the pipeline's normalised
ones (before ``latents_mean`` / ``latents_std`` are undone): the projection reads x̂₀ as the denoiser makes it.

Factors belong to one VAE: an entry is found by :func:`vae_fingerprint` (a digest of the VAE's config), so a
checkpoint with another VAE gets none rather than wrong colours.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

FACTORS_FILE = Path(__file__).with_name("latent_rgb.json")


@dataclass(frozen=True)
class LatentRGB:
    """Fitted factors: ``weights`` (channels rows of (R, G, B)) and ``bias``, mapping normalised latents to RGB in
    [0, 1]; ``correlation``: Pearson r of the projection against the pooled decoded frames of runs the fit did not
    see (grey levels); ``samples``: latent pixels fitted on."""

    model: str
    fingerprint: str
    weights: tuple[tuple[float, float, float], ...]
    bias: tuple[float, float, float]
    correlation: float
    samples: int

    @property
    def channels(self) -> int:
        return len(self.weights)

    def project(self, latents: torch.Tensor) -> torch.Tensor:
        """``(C, ...)`` latents → ``(3, ...)`` RGB in [0, 1], on the latents' device, in fp32."""
        weights = torch.tensor(self.weights, dtype=torch.float32, device=latents.device)  # (C, 3)
        bias = torch.tensor(self.bias, dtype=torch.float32, device=latents.device)
        flat = latents.float().reshape(latents.shape[0], -1)  # (C, N)
        rgb = weights.T @ flat + bias[:, None]
        return rgb.reshape(3, *latents.shape[1:]).clamp(0.0, 1.0)


def vae_fingerprint(config: Mapping[str, Any]) -> str:
    """12 hex digits of sha256 over the VAE's config (keys starting with ``_`` left out: versions, class path)."""
    public = {key: value for key, value in config.items() if not str(key).startswith("_")}
    return hashlib.sha256(json.dumps(public, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _rgb(values: Sequence[float] | np.ndarray) -> tuple[float, float, float]:
    """One (R, G, B) triple of floats (a row of the weights, or the bias)."""
    red, green, blue = (float(v) for v in values)
    return red, green, blue


def load(fingerprint: str, path: Path = FACTORS_FILE) -> LatentRGB | None:
    """The factors fitted for the VAE with ``fingerprint``, None when none were fitted."""
    if not path.is_file():
        return None
    entry = json.loads(path.read_text()).get(fingerprint)
    if entry is None:
        return None
    return LatentRGB(model=entry["model"], fingerprint=fingerprint,
                     weights=tuple(_rgb(row) for row in entry["weights"]),
                     bias=_rgb(entry["bias"]), correlation=float(entry["correlation"]),
                     samples=int(entry["samples"]))


def save(factors: LatentRGB, path: Path = FACTORS_FILE) -> Path:
    """Add or replace ``factors``' entry in ``path`` (other VAEs' entries are kept)."""
    entries = json.loads(path.read_text()) if path.is_file() else {}
    entry = asdict(factors)
    entry.pop("fingerprint")
    entry["weights"] = [[round(v, 6) for v in row] for row in factors.weights]
    entry["bias"] = [round(v, 6) for v in factors.bias]
    entry["correlation"] = round(factors.correlation, 4)
    entries[factors.fingerprint] = entry
    path.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
    return path


def pooled_frames(video: np.ndarray, latent_shape: Sequence[int]) -> np.ndarray:
    """Decoded ``video`` ``[F, H, W, 3]`` brought onto the latent grid ``(L, h, w)``: latent frame ``k`` reads pixel
    frame ``round(k (F − 1) / (L − 1))`` (the VAE's causal chunks keep time in proportion), each latent pixel the
    mean of its ``H/h × W/w`` block. Returns ``[L, h, w, 3]`` float32."""
    frames, height, width = (int(n) for n in latent_shape)
    picked = np.rint(np.linspace(0, video.shape[0] - 1, frames)).astype(int)
    chosen = np.asarray(video[picked], dtype=np.float32)
    sy, sx = chosen.shape[1] // height, chosen.shape[2] // width
    chosen = chosen[:, :height * sy, :width * sx]
    return chosen.reshape(frames, height, sy, width, sx, 3).mean(axis=(2, 4))


def pairs(latents: torch.Tensor, video: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One run's fitting pairs: ``latents`` ``(C, L, h, w)`` (normalised) and its decoded ``video`` → ``(N, C)``
    latent pixels and ``(N, 3)`` pooled colours."""
    channels = latents.shape[0]
    x = latents.detach().float().cpu().numpy().reshape(channels, -1).T
    y = pooled_frames(video, latents.shape[1:]).reshape(-1, 3)
    return x, y


def fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares ``y ≈ x · W + b`` over latent pixels ``x`` ``(N, C)`` and colours ``y`` ``(N, 3)``: ``(W, b)``."""
    design = np.concatenate([x, np.ones((x.shape[0], 1), dtype=x.dtype)], axis=1).astype(np.float64)
    solution, *_ = np.linalg.lstsq(design, y.astype(np.float64), rcond=None)
    return solution[:-1], solution[-1]


def grey_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson r between the grey levels (mean of R, G, B) of two images or image stacks of one shape."""
    ga, gb = np.asarray(a, np.float64).mean(axis=-1).ravel(), np.asarray(b, np.float64).mean(axis=-1).ravel()
    if ga.std() == 0 or gb.std() == 0:
        return 0.0
    return float(np.corrcoef(ga, gb)[0, 1])


def fitted(model: str, fingerprint: str, train: Sequence[tuple[np.ndarray, np.ndarray]],
           held_out: Sequence[tuple[np.ndarray, np.ndarray]]) -> LatentRGB:
    """Factors fitted on ``train`` pairs (:func:`pairs`), scored on ``held_out`` ones."""
    x = np.concatenate([p[0] for p in train])
    y = np.concatenate([p[1] for p in train])
    weights, bias = fit(x, y)
    test_x = np.concatenate([p[0] for p in held_out])
    test_y = np.concatenate([p[1] for p in held_out])
    projected = np.clip(test_x @ weights + bias, 0.0, 1.0)
    return LatentRGB(model=model, fingerprint=fingerprint,
                     weights=tuple(_rgb(row) for row in weights),
                     bias=_rgb(bias), correlation=grey_correlation(projected, test_y),
                     samples=int(x.shape[0]))
