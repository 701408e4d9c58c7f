"""The two VAE decoders, set in closed form to paint and sound the designed latents (no training needed).

Video: the ViT decoder's blocks start as the identity (their residual scales are zero), so a latent voxel's 4×4×4
pixel block is ``proj_out(LayerNorm(proj_in(z)))``. ``post_quant_conv`` undoes the latent normalisation,
``proj_in`` writes ``[z, −z, C, −C, 0…]`` (zero mean, and a norm dominated by the constant ``C``, so the LayerNorm
only divides by a constant), and ``proj_out`` maps the colour channels back to pixels in the decoder's
ImageNet-normalised output space: every block is painted the mean colour its latent holds.

Audio: the BigVGAN decoder's residual blocks are set to the identity and its upsampling chain to sample-and-hold
kernels on two routes. Latent channel :data:`sound.PITCH_CHANNEL["low"]` takes a route whose 200 → 1000 Hz stage
writes the pattern ``+ + + − −`` (a 200 Hz buzz); channel ``"high"`` takes a route whose 2 → 4 kHz stage alternates
signs (a 2 kHz square wave). The level of the channel is the amplitude.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from . import scenes, sound

if TYPE_CHECKING:  # diffusers.models names the real classes (its top-level __init__ shows mypy torch-less dummies)
    from diffusers.models import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio

LAYER_NORM_CONSTANT = 100.0
AUDIO_GAIN = 0.5
LOW_STAGE, HIGH_STAGE = 1, 3  # the upsampling stage (0-based) where each route starts to oscillate


@torch.no_grad()
def set_video_decoder(vae: AutoencoderKLMiniMaxH3, pixel_mean: Sequence[float], pixel_std: Sequence[float]) -> None:
    """``pixel_mean``, ``pixel_std``: the pipeline's per-RGB-channel normalisation of the VAE's pixels."""
    channels = int(vae.config["latent_channels"])
    mean = torch.tensor(vae.config["latents_mean"], dtype=torch.float32)
    std = torch.tensor(vae.config["latents_std"], dtype=torch.float32)
    conv = vae.post_quant_conv
    conv.weight.zero_()
    conv.weight[:, :, 0, 0, 0] = torch.diag(1.0 / std)
    conv.get_parameter("bias").copy_(-mean / std)
    decoder = vae.decoder
    dim = decoder.proj_in.out_features
    decoder.proj_in.weight.zero_()
    decoder.proj_in.bias.zero_()
    for c in range(channels):
        decoder.proj_in.weight[c, c] = 1.0
        decoder.proj_in.weight[channels + c, c] = -1.0
    decoder.proj_in.bias[2 * channels] = LAYER_NORM_CONSTANT
    decoder.proj_in.bias[2 * channels + 1] = -LAYER_NORM_CONSTANT
    for block in decoder.transformer_blocks:
        block.get_parameter("scale1").zero_()
        block.get_parameter("scale2").zero_()
    decoder.norm_out.weight.fill_(1.0)
    decoder.norm_out.bias.zero_()
    sigma = (2 * LAYER_NORM_CONSTANT**2 / dim) ** 0.5  # the LayerNorm's divisor (the latents barely change it)
    patch = decoder.patch_size_t * decoder.patch_size**2
    decoder.proj_out.weight.zero_()
    for c in range(3):
        rows = slice(c * patch, (c + 1) * patch)
        decoder.proj_out.weight[rows, c] = sigma / (scenes.LATENT_GAIN * pixel_std[c])
        decoder.proj_out.bias[rows] = (0.5 - pixel_mean[c]) / pixel_std[c]


def _set_weight_norm(module: torch.nn.Module, weight: torch.Tensor) -> None:
    """Give a weight-normalised conv the weight ``weight`` (``g = ‖v‖`` per output slice; empty slices get g = 0)."""
    dims = tuple(range(1, weight.dim()))
    norms = weight.norm(dim=dims, keepdim=True)
    module.get_parameter("weight_v").copy_(torch.where(norms > 0, weight, torch.ones_like(weight)))
    module.get_parameter("weight_g").copy_(norms)


def _hold_kernel(kernel: int, stride: int, pattern: list[float] | None = None) -> torch.Tensor:
    """A transposed-conv kernel that writes each input sample ``stride`` times (times ``pattern``), for the
    ``padding = (kernel − stride) // 2`` the decoder uses."""
    weights = torch.zeros(kernel)
    start = (kernel - stride) // 2
    weights[start : start + stride] = torch.tensor(pattern if pattern is not None else [1.0] * stride)
    return weights


@torch.no_grad()
def set_audio_decoder(audio_vae: AutoencoderKLMiniMaxH3Audio) -> None:
    decoder = audio_vae.decoder
    routes = {0: sound.PITCH_CHANNEL["low"], 1: sound.PITCH_CHANNEL["high"]}  # route → latent channel
    proj = audio_vae.dec_in_proj
    proj.weight.zero_()
    proj.get_parameter("bias").zero_()
    for route, channel in routes.items():
        proj.weight[route, channel, 0] = 1.0
    pre = torch.zeros_like(decoder.conv_pre.get_parameter("weight_v"))
    for route in routes:
        pre[route, route, pre.shape[-1] // 2] = 1.0
    _set_weight_norm(decoder.conv_pre, pre)
    decoder.conv_pre.get_parameter("bias").zero_()
    rates = [int(r) for r in audio_vae.config["decoder_rates"]]
    for stage, (up, rate) in enumerate(zip(decoder.ups, rates)):
        conv = up.get_submodule("0")  # the stage's weight-normalised transposed conv
        weight = torch.zeros_like(conv.get_parameter("weight_v"))  # [in, out, kernel]
        kernel = weight.shape[-1]
        low = [1.0, 1.0, 1.0, -1.0, -1.0] if stage == LOW_STAGE else None
        high = [1.0, -1.0] if stage == HIGH_STAGE else None
        last = weight.shape[1] == 1
        weight[0, 0] = _hold_kernel(kernel, rate, low)
        weight[1, 0 if last else 1] = _hold_kernel(kernel, rate, high)
        _set_weight_norm(conv, weight)
        conv.get_parameter("bias").zero_()
    for block in decoder.resblocks:
        for conv in block.get_submodule("convs2").children():
            conv.get_parameter("weight_g").zero_()
            conv.get_parameter("bias").zero_()
    decoder.activation_post.get_parameter("act.alpha").fill_(-12.0)  # sin²(e^-12·x)·e^0: the snake term vanishes
    post = torch.zeros_like(decoder.conv_post.get_parameter("weight_v"))
    post[0, 0, post.shape[-1] // 2] = AUDIO_GAIN
    _set_weight_norm(decoder.conv_post, post)
