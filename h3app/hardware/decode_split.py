"""The video decode spread over the ranks of a multi-rank run, as the time model counts it.

The video VAE decodes each temporal clip in overlapping spatial tiles (diffusers' ``AutoencoderKLMiniMaxH3``: tiles
of ``tile_sample_min_height × tile_sample_min_width`` pixels with at least ``tile_sample_min_overlap_*`` pixels of
overlap, on by default; the released frames are the blended ones). With several ranks the tiles of each clip are
divided over the ranks (the recipe sglang and vLLM-Omni use: each rank decodes its tiles, the decoded tiles are
gathered and blended as one rank would), so a rank decodes ``ceil(tiles / ranks)`` of every clip's tiles and then
receives the frames the others decoded.

The time model (``roofline.predict_one``) scales the one-rank decode's FLOPs, moved bytes and ops by
:func:`rank_share` and adds the gather (:func:`gather_bytes` over the GPUs' link).
"""

from __future__ import annotations

import math
from typing import Any

PIXEL_BYTES = 4  # the decoded frames are gathered as float32 (the pipeline's ``video.float()`` before postprocess)


def tiles_along(length: int, tile: int, min_overlap: int) -> int:
    """Tiles of ``tile`` pixels with at least ``min_overlap`` overlap that cover ``length`` pixels: the fewest
    ``n`` with ``n·tile − (n−1)·min_overlap ≥ length`` (1 when one tile covers it)."""
    if tile >= length:
        return 1
    count = math.ceil(length / tile)
    while tile * count - min_overlap * (count - 1) < length:
        count += 1
    return count


def spatial_tiles(vae: Any, height: int, width: int) -> int:
    """Spatial tiles of one clip that ``vae`` decodes at ``height × width`` pixels (1 without tiling or a VAE)."""
    if vae is None or not getattr(vae, "use_tiling", False):
        return 1
    return (tiles_along(height, vae.tile_sample_min_height, vae.tile_sample_min_overlap_height)
            * tiles_along(width, vae.tile_sample_min_width, vae.tile_sample_min_overlap_width))


def rank_share(tiles: int, ranks: int) -> float:
    """The share of the one-rank decode one of ``ranks`` ranks runs: ``ceil(tiles / ranks) / tiles``."""
    tiles, ranks = max(1, tiles), max(1, ranks)
    return math.ceil(tiles / ranks) / tiles


def gather_bytes(video_shape: tuple[int, ...], ranks: int) -> float:
    """Bytes one rank receives when the decoded tiles are gathered: the others' share of the frames
    (``video_shape``'s elements as float32), ``(ranks − 1) / ranks`` of them; 0 on one rank."""
    if ranks <= 1 or not video_shape:
        return 0.0
    return math.prod(video_shape) * PIXEL_BYTES * (ranks - 1) / ranks
