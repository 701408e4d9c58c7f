"""The procedural data set: a coloured ball moving over a coloured floor, described by a fixed prompt grammar.

Video latents are *designed*, not learned: latent channels 0-2 hold the mean colour of the 4×4 pixel block (and of
the pixel frames the latent frame covers), channel 3 how much of it the ball covers. The video decoder is trained to
paint frames from them; the transformer is trained to produce them. Colours are in [0, 1], latents roughly in ±1.5.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ...rules.frames import FPS

HEIGHT, WIDTH = 32, 56  # the tiny default canvas (16:9 at short edge 32, a multiple of 8)
SPATIAL, CLIP, LATENTS_PER_CLIP, TOKEN_DROP = 4, 17, 5, 3  # the tiny video VAE's chunking
LATENT_GAIN = 3.0

BALL_COLOURS = {"red": (0.9, 0.1, 0.1), "yellow": (0.95, 0.85, 0.1), "green": (0.1, 0.75, 0.2),
                "blue": (0.1, 0.25, 0.95)}
FLOOR_COLOURS = {"grey": (0.5, 0.5, 0.5), "sand": (0.8, 0.72, 0.52)}
MOTIONS = {"left": (-1.0, 0.0), "right": (1.0, 0.0), "up": (0.0, -1.0), "down": (0.0, 1.0)}
PITCHES = ("low", "high")
LOUDNESS = ("soft", "loud")
WARM = np.array((1.0, 0.55, 0.15))  # the style LoRA's target tint
WARM_MIX = 0.55

# Words the tiny tokenizer keeps whole (one token, one embedding each); any other text is spelled out in bytes.
VOCABULARY = ("a", "ball", "moving", "over", "floor", "hum", *BALL_COLOURS, *MOTIONS, *FLOOR_COLOURS, *PITCHES,
              *LOUDNESS, "orange")

BALL_RADIUS = 8.0  # pixels
SPEED = 3.0  # pixels per second


@dataclass(frozen=True)
class Scene:
    """One clip: ball and floor colours (RGB in [0, 1]), start centre and velocity in pixels (per second)."""

    ball: tuple[float, float, float]
    floor: tuple[float, float, float]
    start: tuple[float, float]  # (x, y)
    velocity: tuple[float, float]
    pitch: str = "low"
    loudness: str = "soft"


@dataclass(frozen=True)
class PromptWords:
    colour: str
    motion: str
    floor: str
    pitch: str
    loudness: str

    @property
    def text(self) -> str:
        return f"a {self.colour} ball moving {self.motion} over a {self.floor} floor, {self.pitch} {self.loudness} hum"


def all_prompts() -> list[PromptWords]:
    """Every prompt of the grammar (4 colours × 4 motions × 2 floors × 2 pitches × 2 loudnesses = 128)."""
    return [PromptWords(*words) for words in itertools.product(BALL_COLOURS, MOTIONS, FLOOR_COLOURS, PITCHES, LOUDNESS)]


def scene_for(words: PromptWords, rng: np.random.Generator) -> Scene:
    """The scene a prompt describes; the start point jitters by up to 2 px so that the noise seed matters."""
    dx, dy = MOTIONS[words.motion]
    jitter = rng.uniform(-2.0, 2.0, size=2)
    return Scene(ball=BALL_COLOURS[words.colour], floor=FLOOR_COLOURS[words.floor],
                 start=(WIDTH / 2 + jitter[0], HEIGHT / 2 + jitter[1]), velocity=(dx * SPEED, dy * SPEED),
                 pitch=words.pitch, loudness=words.loudness)


def render(scene: Scene, num_frames: int) -> tuple[np.ndarray, np.ndarray]:
    """``(frames [F, H, W, 3] in [0, 1], coverage [F, H, W] in [0, 1])`` with an anti-aliased ball edge."""
    t = np.arange(num_frames, dtype=np.float64)[:, None, None] / FPS
    ys, xs = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float64) + 0.5
    cx = scene.start[0] + scene.velocity[0] * t
    cy = scene.start[1] + scene.velocity[1] * t
    distance = np.sqrt((xs[None] - cx) ** 2 + (ys[None] - cy) ** 2)
    coverage = np.clip(BALL_RADIUS + 0.5 - distance, 0.0, 1.0)
    shade = 1.0 - 0.25 * np.clip((ys[None] - cy) / BALL_RADIUS, -1, 1)  # lit from above
    ball = np.asarray(scene.ball)[None, None, None] * np.clip(shade, 0, 1)[..., None]
    floor = np.asarray(scene.floor)[None, None, None] * (0.85 + 0.15 * ys[None, :, :, None] / HEIGHT)
    frames = coverage[..., None] * ball + (1 - coverage[..., None]) * floor
    return frames.astype(np.float32), coverage.astype(np.float32)


def latent_frame_groups(num_frames: int) -> list[list[int]]:
    """The pixel frames each latent frame stands for, following the VAE's chunking: a 17-frame clip becomes latent
    frames covering frames ``[0], [1-4], [5-8], [9-12], [13-16]``; the tail is padded with the last frame and the last
    ``token_drop`` latent frames are dropped."""
    padded = num_frames + (-num_frames) % CLIP
    groups = []
    for start in range(0, padded, CLIP):
        groups.append([start])
        groups += [list(range(start + 1 + 4 * j, start + 5 + 4 * j)) for j in range(LATENTS_PER_CLIP - 1)]
    groups = groups[:-TOKEN_DROP]
    return [[min(f, num_frames - 1) for f in group] for group in groups]


def video_latents(frames: np.ndarray, coverage: np.ndarray) -> np.ndarray:
    """Designed latents ``[4, T, H/4, W/4]`` of rendered frames (T from :func:`latent_frame_groups`)."""
    num_frames, height, width = coverage.shape
    planes = np.concatenate([frames, coverage[..., None]], axis=-1)
    pooled = planes.reshape(num_frames, height // SPATIAL, SPATIAL, width // SPATIAL, SPATIAL, 4).mean(axis=(2, 4))
    grouped = np.stack([pooled[group].mean(axis=0) for group in latent_frame_groups(num_frames)])
    latents = (grouped - 0.5) * LATENT_GAIN
    return np.ascontiguousarray(latents.transpose(3, 0, 1, 2), dtype=np.float32)


def warm_latents(latents: np.ndarray) -> np.ndarray:
    """The same latents with every colour pulled towards orange (what the style LoRA learns): linear in the colour
    channels, since the colour channels are block means."""
    out = latents.copy()
    colours = latents[:3] / LATENT_GAIN + 0.5
    warm = (1 - WARM_MIX) * colours + WARM_MIX * WARM[:, None, None, None]
    out[:3] = (warm - 0.5) * LATENT_GAIN
    return out.astype(np.float32)
