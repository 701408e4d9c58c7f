"""Rectified flow in MiniMax-H3's conventions, on the packed sequence the pipeline builds.

``t = 1 - sigma`` (``t = 1`` is clean), ``x_t = t·x0 + sigma·noise`` and the transformer predicts the data-ward velocity
``v = x0 - noise``. Video and audio follow their own shifted schedules (shift 12 / 3) from one shared base level,
exactly as the sampler pairs them; layouts and row timesteps come from diffusers' own pipeline blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import scenes


def shifted(base: torch.Tensor | float, shift: float) -> torch.Tensor:
    """The scheduler's exponential shift ``s·σ / (1 + (s − 1)·σ)``."""
    base = torch.as_tensor(base, dtype=torch.float32)
    return shift * base / (1 + (shift - 1) * base)


@dataclass
class Layout:
    """One prompt's packed sequence: embeddings ``[1, T, 8]`` and the transformer's layout keyword arguments."""

    prompt_embeds: torch.Tensor
    fields: dict[str, torch.Tensor]
    num_video_rows: int
    num_audio_rows: int


class FlowContext:
    """What a training step needs from the pipeline: prompt layouts, latent sizes and the two shifts."""

    def __init__(self, pipe, num_frames: int = 124):
        from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (
            audio_latent_num_frames,
            video_latent_num_frames,
        )

        self.pipe = pipe
        self.num_frames = num_frames
        self.num_latent_frames = video_latent_num_frames(num_frames, pipe.vae_frames_per_chunk,
                                                         pipe.vae_latents_per_chunk)
        self.num_audio_latents = audio_latent_num_frames(num_frames)
        ratio = pipe.vae_spatial_compression_ratio
        self.latent_size = (scenes.HEIGHT // ratio, scenes.WIDTH // ratio)
        self.video_shift = float(pipe.scheduler.config.shift)
        self.audio_shift = float(pipe.audio_scheduler.config.shift)
        self._layouts: dict[str, Layout] = {}

    @torch.no_grad()
    def layout(self, prompt: str) -> Layout:
        if prompt not in self._layouts:
            from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep
            from diffusers.modular_pipelines.minimax_h3.encoders import get_qwen3vl_prompt_embeds

            pipe = self.pipe
            token_ids = pipe.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            embeds = get_qwen3vl_prompt_embeds(pipe.text_encoder, pipe.processor, token_ids, {},
                                               text_encoder_layer=pipe.text_encoder_layer).float()
            tags = torch.full((len(token_ids),), pipe.text_tag, dtype=torch.long)
            position_ids, token_tags, video_indices, audio_indices, text_indices, _, _ = (
                MiniMaxH3PrepareLayoutStep.build_packed_sequence(
                    tags, self.num_latent_frames, *self.latent_size, self.num_audio_latents, pipe.patch_size,
                    pipe.audio_channels, pipe.audio_tag, pipe.video_tag))
            fields = {"position_ids": position_ids, "token_tags": token_tags, "video_indices": video_indices,
                      "audio_indices": audio_indices, "text_indices": text_indices}
            self._layouts[prompt] = Layout(embeds, fields, int(video_indices.numel()), int(audio_indices.numel()))
        return self._layouts[prompt]

    def video_rows(self, latents: torch.Tensor) -> torch.Tensor:
        """``[C, T, h, w]`` normalised latents → the pipeline's packed rows ``[T·h/2·w/2, C·4]``."""
        from diffusers.modular_pipelines.minimax_h3.before_denoise import patchify_video_latents

        return patchify_video_latents(latents[None], self.pipe.patch_size)

    def velocity(self, transformer, layout: Layout, video: torch.Tensor, audio: torch.Tensor,
                 t_video: float | torch.Tensor, t_audio: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The transformer's velocity for rows ``video [Nv, 16]`` / ``audio [Na, 8]`` at timesteps ``t`` (a float or
        a 0-dim tensor)."""
        from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3SetTimestepsStep

        fields = layout.fields
        timestep, indices = MiniMaxH3SetTimestepsStep.build_row_timesteps(
            fields["video_indices"], fields["audio_indices"], 0, 0, fields["text_indices"].numel(),
            float(t_video), float(t_audio), max(float(t_video), self.pipe.keyframe_noise_aug), 1.0)
        video_v, audio_v = transformer(
            hidden_states=video[None], audio_hidden_states=audio[None], encoder_hidden_states=layout.prompt_embeds,
            timestep=timestep, timestep_indices=indices, return_dict=False, **fields)
        return video_v[0].float(), audio_v[0].float()

    def sigmas(self, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Video and audio sigma grids of an ``steps``-point schedule (terminal 0 included), as the scheduler builds."""
        base = torch.linspace(1.0, 0.0, steps, dtype=torch.float32)
        video = torch.unique_consecutive(shifted(base, self.video_shift))
        audio = torch.unique_consecutive(shifted(base, self.audio_shift))
        return video, audio

    def sample(self, transformer, layout: Layout, video: torch.Tensor, audio: torch.Tensor, steps: int):
        """Euler sampling from noise rows, the scheduler's update ``x ← r·x + (1 − r)·(x + σ·v)``, ``r = σ'/σ``."""
        video_sigmas, audio_sigmas = self.sigmas(steps)
        for i in range(len(video_sigmas) - 1):
            sv, sa = video_sigmas[i], audio_sigmas[i]
            v_video, v_audio = self.velocity(transformer, layout, video, audio, 1 - sv, 1 - sa)
            rv, ra = video_sigmas[i + 1] / sv, audio_sigmas[i + 1] / sa
            video = rv * video + (1 - rv) * (video + sv * v_video)
            audio = ra * audio + (1 - ra) * (audio + sa * v_audio)
        return video, audio
