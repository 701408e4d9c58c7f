"""The video VAE's tiled decode spread over the ranks: each rank decodes its share of the tiles, all ranks then hold
every tile and blend them exactly as one process does.

diffusers' H3 video VAE decodes a latent video in temporal clips (``tokens_chunk_size`` latent frames plus the
overlap ``token_drop`` leaves), each clip in overlapping spatial tiles (256 × 256 pixels, at least 64 apart, the
released recipe that is on by default: the released frames are the blended-tile ones). Every tile is one call of
``vae.decoder`` on a slice of the latents; the clips and tiles are then cross-faded by the VAE's own blend. Those
decoder calls are the whole cost and depend only on the latents, so they can run anywhere; the blend needs them all.

:class:`SpreadDecode` (installed as the VAE's ``decode`` on every rank by :func:`spread_decode`) runs diffusers'
own ``decode`` twice, with a hook on ``vae.decoder`` (diffusers' public ``HookRegistry``):

1. **share**: every decoder call records its input's shape; call k is this rank's when ``k % ranks == rank``
   and is decoded now; every call returns a placeholder on the ``meta`` device (no memory, no work), so the VAE's
   blend runs on shapes alone. The ranks then agree (a rank that failed its share stops all, as between steps).
2. **blend**: ``decode`` again; call k now broadcasts output k from its rank to all (``torch.distributed``, the
   world group: gloo on CPU, nccl on CUDA; every rank makes the same calls in the same order) and returns it, and
   the VAE cuts, blends and joins the outputs itself. A rank holds its own share until it is sent, and the others'
   tiles only while the VAE blends them (one clip's tiles at a time, as in one process).

The same tensors go through the same code: the frames equal one process's tiled decode bit for bit (when a tile
decodes to the same bits on every rank: same kernels, same shapes; tests/test_decode_ranks.py).

A step preview decodes on rank 0 alone and calls the class's ``decode`` (``model/preview_decoders``), never this one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from diffusers.hooks import HookRegistry, ModelHook

from ..errors import H3AppError

DECODE_HOOK = "h3app_spread_decode"
SHARE, BLEND = "share", "blend"


class _Tiles(ModelHook):
    """On ``vae.decoder``: outside :class:`SpreadDecode` a plain forward; inside, the share and blend passes."""

    def __init__(self) -> None:
        super().__init__()
        self.mode: str | None = None
        self.rank, self.ranks = 0, 1
        self.shapes: list[torch.Size] = []  # each call's input shape, in call order (share)
        self.mine: dict[int, torch.Tensor] = {}  # this rank's decoded calls, until blend hands them out
        self.calls = 0

    def decoder(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The decoder's own forward."""
        forward: Any = self.fn_ref.original_forward  # set by HookRegistry when the hook has new_forward
        return forward(hidden_states)

    def new_forward(self, module: Any, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.mode is None:
            return self.decoder(hidden_states)
        k, self.calls = self.calls, self.calls + 1
        shape, dtype, owner = output_shape(module, hidden_states.shape), output_dtype(module), k % self.ranks
        if self.mode == SHARE:
            self.shapes.append(hidden_states.shape)
            if owner == self.rank:
                out = self.decoder(hidden_states)
                if out.shape != shape or out.dtype != dtype:
                    raise H3AppError(f"the video decoder returned {tuple(out.shape)} {out.dtype} where h3app expected "
                                     f"{tuple(shape)} {dtype}: this diffusers version's decoder is not the one the "
                                     f"ranks' shared decode was written for; run on one rank.")
                self.mine[k] = out
            return torch.empty(shape, dtype=dtype, device="meta")
        if k >= len(self.shapes) or hidden_states.shape != self.shapes[k]:
            raise H3AppError("the video VAE's second pass asked for other tiles than its first (the shared decode "
                             "replays the same calls): run on one rank.")
        return broadcast(self.mine.pop(k) if owner == self.rank else None, owner, shape, dtype, hidden_states.device)

    def start(self, mode: str, rank: int = 0, ranks: int = 1) -> None:
        self.mode, self.calls = mode, 0
        if mode == SHARE:
            self.rank, self.ranks, self.shapes, self.mine = rank, ranks, [], {}

    def stop(self) -> None:
        self.mode, self.calls, self.mine = None, 0, {}


def broadcast(tensor: torch.Tensor | None, owner: int, shape: torch.Size, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    """``owner``'s ``tensor`` on every rank (the world group); the other ranks pass None."""
    import torch.distributed as dist

    out = tensor.contiguous() if tensor is not None else torch.empty(shape, dtype=dtype, device=device)
    dist.broadcast(out, src=owner)
    return out


def output_shape(decoder: Any, latent: torch.Size) -> torch.Size:
    """The decoder's output for a ``[B, C, T, H, W]`` latent tile: ``[B, out_channels, T·pt, H·p, W·p]``."""
    batch, _, frames, height, width = latent
    return torch.Size((batch, decoder.out_channels, frames * decoder.patch_size_t, height * decoder.patch_size,
                       width * decoder.patch_size))


def output_dtype(decoder: Any) -> torch.dtype:
    """What the decoder returns: the dtype its ``proj_out`` computes in (fp32, or ``--vae-dtype``)."""
    return decoder.proj_out.weight.dtype


class SpreadDecode:
    """``vae.decode`` with its tiles spread over the ranks of ``torch.distributed``'s world (same signature)."""

    def __init__(self, vae: Any, agree: Callable[[], Any] | None = None) -> None:
        self.vae, self.agree = vae, agree
        registry = HookRegistry.check_if_exists_or_initialize(vae.decoder)
        hook = registry.get_hook(DECODE_HOOK)
        if not isinstance(hook, _Tiles):
            hook = _Tiles()
            registry.register_hook(hook, DECODE_HOOK)
        self.tiles = hook

    def __call__(self, z: torch.Tensor, return_dict: bool = True) -> Any:
        import torch.distributed as dist

        decode = type(self.vae).decode  # diffusers' own, on this instance
        try:
            self.tiles.start(SHARE, dist.get_rank(), dist.get_world_size())
            decode(self.vae, z, return_dict=False)  # on meta: the shapes of the blend, and this rank's tiles decoded
            if self.agree is not None:  # a rank that failed its share stops the others here, not in a broadcast
                self.agree()
            self.tiles.start(BLEND)
            return decode(self.vae, z, return_dict=return_dict)
        finally:
            self.tiles.stop()


def spread_decode(vae: Any, agree: Callable[[], Any] | None = None) -> None:
    """Make ``vae.decode`` spread its tiles over the ranks (idempotent; every rank must call it: the decode then
    takes every rank, as the transformer's steps do). ``agree``: called on every rank between the two passes (the
    job's agreement, ``RankGroup.step``: it raises ``PeerFailed`` when another rank failed its share)."""
    if not isinstance(vae.__dict__.get("decode"), SpreadDecode):
        vae.decode = SpreadDecode(vae, agree)
