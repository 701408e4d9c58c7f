"""The training recipe, stage by stage, resumable from a work folder; deterministic on CPU (seeded, one thread).

The two VAE decoders are set in closed form (:mod:`.decoders`); then ``base`` (the transformer, flow matching on the
data set) → the checkpoint folder → ``style`` (warm LoRA) and ``turbo`` (4-evaluation LoRA distilled from 50-step
results). Each stage saves its result in the work folder and is skipped when that result is already there.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...rules.choices import MAIN_PARTITION, REFERENCE_PARTITION
from ...rules.frames import RELEASED
from . import decoders, flow, lora, scenes, sound

THREADS = 1  # one thread: on a busy machine, OpenMP threads waiting on each other cost 30× the work
SEED = 20261201
TURBO_RANK, TURBO_ALPHA = 16, 1.0  # alpha = r/16, like LightX2V's rank 128 / alpha 8
STYLE_RANK, STYLE_ALPHA = 4, 2.0
TURBO_STEPS, TEACHER_STEPS = 5, 50
# two VAE chunks (12 latent frames), and the app's shortest clip (5 s: 124 frames, 37 latent frames)
SHORT_FRAMES = 2 * RELEASED.frames_per_chunk + RELEASED.latents_per_chunk
FULL_FRAMES = RELEASED.frames(RELEASED.shortest_seconds)
TURBO_FRAMES = SHORT_FRAMES  # the 4-step correction is per token: distilled on short clips, used at any length
TURBO_FILE = "tiny_turbo_4step.safetensors"
STYLE_FILE = "tiny_style_warm.safetensors"
# base loss: video elements weighted 1 + BALL_WEIGHT × the ball's coverage (where the colour words show), normalised
# to mean 1; the video loss counts VIDEO_WEIGHT × the audio loss
BALL_WEIGHT, VIDEO_WEIGHT = 10.0, 2.0


@dataclass(frozen=True)
class Recipe:
    """Optimiser steps per stage (the defaults are the committed run; ``smoke()`` runs every line in seconds)."""

    base_short_steps: int = 2500
    base_full_steps: int = 150
    style_steps: int = 150
    turbo_pairs: int = 8
    turbo_steps: int = 100
    teacher_steps: int = TEACHER_STEPS

    @classmethod
    def smoke(cls) -> Recipe:
        return cls(base_short_steps=1, base_full_steps=1, style_steps=1,
                   turbo_pairs=1, turbo_steps=1, teacher_steps=3)


class Progress:
    """One line per logged step: stage, step/total, smoothed loss, elapsed and remaining seconds."""

    def __init__(self, every: int = 10, stream=None):
        self.every, self.stream = every, stream
        self.start = time.perf_counter()
        self._stage_start: dict[str, float] = {}
        self._smoothed: dict[str, float] = {}

    def __call__(self, stage: str, step: int, total: int, loss: float) -> None:
        now = time.perf_counter()
        began = self._stage_start.setdefault(stage, now)
        previous = self._smoothed.get(stage, loss)
        self._smoothed[stage] = smoothed = 0.9 * previous + 0.1 * loss if step > 1 else loss
        if step % self.every and step != total:
            return
        eta = (now - began) / step * (total - step)
        print(f"[{now - self.start:7.0f}s] {stage:8s} {step:5d}/{total:<5d} loss {smoothed:.4f} (last {loss:.4f}) "
              f"eta {eta:5.0f}s", file=self.stream, flush=True)


def _pipeline(components: dict[str, Any]):
    # the defining module: diffusers' package __init__ shows type checkers its torch-less dummy class
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import MiniMaxH3Blocks

    pipe = MiniMaxH3Blocks().init_pipeline()
    pipe.update_components(**components)
    return pipe


class Batches:
    """Training examples in a seeded order: every prompt of the grammar once per epoch."""

    def __init__(self, ctx: flow.FlowContext, seed: int, warm: bool = False):
        self.ctx, self.warm = ctx, warm
        self.rng = np.random.default_rng(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.prompts = scenes.all_prompts()
        self.order: list[int] = []

    def next(self):
        if not self.order:
            self.order = list(self.rng.permutation(len(self.prompts)))
        words = self.prompts[self.order.pop()]
        frames, coverage = scenes.render(scenes.scene_for(words, self.rng), self.ctx.num_frames)
        latents = scenes.video_latents(frames, coverage)
        if self.warm:
            latents = scenes.warm_latents(latents)
        video = self.ctx.video_rows(torch.from_numpy(latents))
        audio = sound.audio_rows(words.pitch, words.loudness, self.ctx.num_audio_latents)
        return self.ctx.layout(words.text), video, audio

    def noised(self, video: torch.Tensor, audio: torch.Tensor):
        """``(x_video, x_audio, t_video, t_audio, noise_video, noise_audio)`` at one shared base level."""
        base = float(torch.rand((), generator=self.generator))
        sigma_v = float(flow.shifted(base, self.ctx.video_shift))
        sigma_a = float(flow.shifted(base, self.ctx.audio_shift))
        noise_v = torch.randn(video.shape, generator=self.generator)
        noise_a = torch.randn(audio.shape, generator=self.generator)
        return ((1 - sigma_v) * video + sigma_v * noise_v, (1 - sigma_a) * audio + sigma_a * noise_a,
                1 - sigma_v, 1 - sigma_a, noise_v, noise_a)


def ball_weights(video: torch.Tensor, ball_weight: float) -> torch.Tensor:
    """Per-element loss weights ``[N, 16]`` for video rows ``[N, 16]`` (columns channel-major, 4 per channel):
    ``1 + ball_weight × coverage`` at each latent position, normalised to mean 1."""
    coverage = (video[:, 12:16] / scenes.LATENT_GAIN + 0.5).clamp(0.0, 1.0)  # channel 3: the ball's coverage
    weights = (1.0 + ball_weight * coverage).repeat(1, 4)
    return weights / weights.mean()


def _flow_loss(ctx: flow.FlowContext, transformer, batches: Batches, ball_weight: float = 0.0,
               video_weight: float = 1.0) -> torch.Tensor:
    layout, video, audio = batches.next()
    x_v, x_a, t_v, t_a, n_v, n_a = batches.noised(video, audio)
    v_video, v_audio = ctx.velocity(transformer, layout, x_v, x_a, t_v, t_a)
    video_loss = torch.mean(ball_weights(video, ball_weight) * (v_video - (video - n_v)) ** 2)
    return video_weight * video_loss + torch.mean((v_audio - (audio - n_a)) ** 2)


def _cosine(optimiser, steps: int, warmup: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(steps - warmup, 1)))

    return torch.optim.lr_scheduler.LambdaLR(optimiser, factor)


def train_base(components: dict[str, Any], recipe: Recipe, log: Progress, snapshot: Path | None = None) -> float:
    """The transformer, flow matching on the data set: first on short clips (``SHORT_FRAMES``, attention is ~8×
    cheaper), then on the full 5-second layout the app generates.

    Why the ball weighting: the video and audio rows read their words through one small text stream, and whichever
    modality's words are learned first take it over. Unweighted, the sound words (which shape every audio row) win,
    the text refiner flattens the colour words and the video rows stop attending to the text; the ball is ~12 % of
    the latent positions, too small a share of the loss to turn that round (docs/demo.md, "Colour words")."""
    transformer = components[MAIN_PARTITION]
    pipe = _pipeline(components)
    phases = ((flow.FlowContext(pipe, SHORT_FRAMES), recipe.base_short_steps),
              (flow.FlowContext(pipe, FULL_FRAMES), recipe.base_full_steps))
    total = recipe.base_short_steps + recipe.base_full_steps
    transformer.requires_grad_(True).train()
    params = list(transformer.parameters())
    optimiser = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01)
    schedule = _cosine(optimiser, total, warmup=min(30, total))
    loss_value, step = float("nan"), 0
    for phase, (ctx, steps) in enumerate(phases):
        batches = Batches(ctx, SEED + 20 + phase)
        for _ in range(steps):
            loss = _flow_loss(ctx, transformer, batches, BALL_WEIGHT, VIDEO_WEIGHT)
            optimiser.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimiser.step()
            schedule.step()
            loss_value, step = float(loss.detach()), step + 1
            log("base", step, total, loss_value)
            if snapshot is not None and step % 100 == 0:
                torch.save(transformer.state_dict(), snapshot)
    transformer.requires_grad_(False).eval()
    return loss_value


def train_style(components: dict[str, Any], steps: int, log: Progress) -> lora.TrainingLora:
    """A warm/orange style LoRA: flow matching towards :func:`scenes.warm_latents`, base frozen."""
    transformer = components[MAIN_PARTITION]
    ctx = flow.FlowContext(_pipeline(components), SHORT_FRAMES)
    adapter = lora.TrainingLora.start(transformer, STYLE_RANK, STYLE_ALPHA, SEED + 30)
    optimiser = torch.optim.Adam(adapter.parameters(), lr=5e-3)
    batches = Batches(ctx, SEED + 31, warm=True)
    with adapter.bound(transformer):
        for step in range(steps):
            loss = _flow_loss(ctx, transformer, batches)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            log("style", step + 1, steps, float(loss.detach()))
    return adapter


def turbo_pairs(count: int) -> list[tuple[str, int]]:
    """``(prompt, seed)`` pairs the Turbo LoRA is distilled on (spread over the grammar; seeds 1000 + i)."""
    prompts = scenes.all_prompts()
    stride = max(len(prompts) // max(count, 1), 1)
    return [(prompts[(i * stride + 5 * i) % len(prompts)].text, 1000 + i) for i in range(count)]


def pipeline_noise(ctx: flow.FlowContext, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The noise rows the pipeline draws for ``seed`` (video latents first, then audio rows)."""
    generator = torch.Generator().manual_seed(seed)
    video = torch.randn((1, ctx.pipe.vae_latent_channels, ctx.num_latent_frames, *ctx.latent_size), generator=generator)
    audio = torch.randn((ctx.num_audio_latents * ctx.pipe.audio_channels, ctx.pipe.audio_latent_channels),
                        generator=generator)
    return ctx.video_rows(video[0]), audio


def train_turbo(components: dict[str, Any], recipe: Recipe, log: Progress) -> lora.TrainingLora:
    """Distil the 50-step sampler into 4 evaluations (``steps=5``) at alpha = r/16, from the same noise."""
    transformer = components[MAIN_PARTITION]
    ctx = flow.FlowContext(_pipeline(components), TURBO_FRAMES)
    pairs = []
    with torch.no_grad():
        for index, (prompt, seed) in enumerate(turbo_pairs(recipe.turbo_pairs)):
            layout = ctx.layout(prompt)
            noise_v, noise_a = pipeline_noise(ctx, seed)
            target = ctx.sample(transformer, layout, noise_v, noise_a, recipe.teacher_steps)
            pairs.append((layout, noise_v, noise_a, target))
            log("teacher", index + 1, recipe.turbo_pairs, 0.0)
    adapter = lora.TrainingLora.start(transformer, TURBO_RANK, TURBO_ALPHA, SEED + 40)
    optimiser = torch.optim.Adam(adapter.parameters(), lr=1e-2)
    with adapter.bound(transformer):
        for step in range(recipe.turbo_steps):
            layout, noise_v, noise_a, (target_v, target_a) = pairs[step % len(pairs)]
            video, audio = ctx.sample(transformer, layout, noise_v, noise_a, TURBO_STEPS)
            loss = torch.mean((video - target_v) ** 2) + torch.mean((audio - target_a) ** 2)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            log("turbo", step + 1, recipe.turbo_steps, float(loss.detach()))
    return adapter


STAGES = ("base", "style", "turbo")


@dataclass(frozen=True)
class Checkpoint:
    """How the tiny checkpoint is built (``() -> components``) and written (``(components, dir) -> dir``)."""

    build: Callable[[], dict[str, Any]]
    save: Callable[[dict[str, Any], Path], Path]


def train(checkpoint: Checkpoint, out_dir: Path, adapters_dir: Path, work_dir: Path, recipe: Recipe = Recipe(),
          log: Progress | None = None, only: str | None = None) -> None:
    """Run (or resume) every stage; writes the checkpoint to ``out_dir`` and the two LoRAs to ``adapters_dir``.

    ``checkpoint`` builds the untrained components and saves them (``h3app.model.tiny`` hands in its own, so the
    recipe never imports the module that runs it). ``only`` runs one stage into ``work_dir`` and stops (style and
    turbo both need base, not each other, so they can run side by side).
    """
    build_components, save_checkpoint = checkpoint.build, checkpoint.save
    torch.set_num_threads(THREADS)
    log = log or Progress()
    work_dir.mkdir(parents=True, exist_ok=True)
    components = build_components()
    pipe = _pipeline(components)
    decoders.set_video_decoder(components["vae"], pipe.pixel_mean, pipe.pixel_std)
    decoders.set_audio_decoder(components["audio_vae"])
    base = work_dir / "base.pt"
    if base.exists():
        components[MAIN_PARTITION].load_state_dict(torch.load(base))
    elif only in (None, "base"):
        train_base(components, recipe, log, work_dir / "base.partial.pt")
        torch.save(components[MAIN_PARTITION].state_dict(), base)
    if only == "base":
        return
    if not base.exists():
        raise RuntimeError(f"stage {only!r} needs the base stage: run it first (no {base}).")
    components[REFERENCE_PARTITION] = copy.deepcopy(components[MAIN_PARTITION])
    if only is None:
        save_checkpoint(components, out_dir)
    adapters_dir.mkdir(parents=True, exist_ok=True)
    for stage, file_name, run, write in (
        ("style", STYLE_FILE, lambda: train_style(components, recipe.style_steps, log), lora.write_with_alpha),
        ("turbo", TURBO_FILE, lambda: train_turbo(components, recipe, log), lora.write_turbo),
    ):
        if only is not None and only != stage:
            continue
        saved = work_dir / f"{stage}.pt"
        adapter = lora.TrainingLora.load(saved) if saved.exists() else run()
        adapter.save(saved)
        write(adapter, adapters_dir / file_name)
