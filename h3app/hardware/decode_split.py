"""The video decode spread over the ranks of a multi-rank run, as the time model counts it.

The video VAE decodes the latents in temporal clips (``tokens_chunk_size`` latent frames plus the ``token_overlap``
that ``token_drop`` leaves) and each clip in overlapping spatial tiles (``tile_sample_min_height × _width`` pixels,
at least ``tile_sample_min_overlap_*`` apart; on by default, and the released frames are the blended ones): one
decoder call per (clip, tile). With several ranks the calls are shared as ``parallel/decode.py`` shares them (the
recipe sglang and vLLM-Omni use): call k runs on rank ``k mod N``, then every call's tile is broadcast to every
rank, which blends them as one process would. A rank therefore runs ``ceil(calls / N)`` calls and receives the
tiles of the others.

The time model (``roofline.predict_one``) scales the one-rank decode's FLOPs, moved bytes and ops by
:func:`rank_share` and adds the tiles received (:func:`gather_bytes`) over the GPUs' link.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

PIXEL_BYTES = 4  # a decoded tile travels as float32
CHANNELS = 3


@dataclass(frozen=True)
class DecodeCalls:
    """The video decode's decoder calls (``calls``: clips × spatial tiles) and the bytes of one call's tile."""

    calls: int = 1
    call_bytes: int = 0


def tiles_along(length: int, tile: int, min_overlap: int) -> int:
    """Tiles of ``tile`` pixels with at least ``min_overlap`` overlap that cover ``length`` pixels: the fewest
    ``n`` with ``n·tile − (n−1)·min_overlap ≥ length`` (1 when one tile covers it)."""
    if tile >= length:
        return 1
    count = math.ceil(length / tile)
    while tile * count - min_overlap * (count - 1) < length:
        count += 1
    return count


def clips(vae: Any, latent_frames: int) -> int:
    """Temporal clips the VAE decodes ``latent_frames`` in: the latents plus ``token_drop`` padded to whole
    ``tokens_chunk_size`` chunks, less one when ``token_drop`` is set (its tail overlaps the next clip)."""
    chunk, drop = int(vae.tokens_chunk_size), int(vae.config.token_drop)
    tokens = latent_frames + drop
    return max(1, (tokens + (-tokens) % chunk) // chunk - int(drop > 0))


def decode_calls(vae: Any, latent_frames: int, height: int, width: int) -> DecodeCalls:
    """The decoder calls of ``vae`` decoding ``latent_frames`` at ``height × width`` pixels, and one call's tile
    bytes (its clip's pixel frames × the tile's pixels × RGB, float32); one call without a VAE."""
    if vae is None or not latent_frames:
        return DecodeCalls()
    tiled = bool(getattr(vae, "use_tiling", False))
    tile_h = min(height, vae.tile_sample_min_height) if tiled else height
    tile_w = min(width, vae.tile_sample_min_width) if tiled else width
    tiles = (tiles_along(height, vae.tile_sample_min_height, vae.tile_sample_min_overlap_height)
             * tiles_along(width, vae.tile_sample_min_width, vae.tile_sample_min_overlap_width)) if tiled else 1
    frames = (int(vae.tokens_chunk_size) + int(vae.token_overlap)) * int(vae.temporal_compression_ratio)
    return DecodeCalls(clips(vae, latent_frames) * tiles, frames * tile_h * tile_w * CHANNELS * PIXEL_BYTES)


def rank_share(calls: int, ranks: int) -> float:
    """The share of the one-rank decode one of ``ranks`` ranks runs: ``ceil(calls / ranks) / calls``."""
    calls, ranks = max(1, calls), max(1, ranks)
    return math.ceil(calls / ranks) / calls


def gather_bytes(split: DecodeCalls, ranks: int) -> int:
    """Bytes the rank that ran the fewest calls receives (the tiles of every other call); 0 on one rank."""
    if ranks <= 1:
        return 0
    return (split.calls - split.calls // ranks) * split.call_bytes
