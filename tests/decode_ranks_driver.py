"""A program every rank runs (``python tests/decode_ranks_driver.py OUT_DIR --ulysses 2``): the tiny video VAE decodes
seeded latents once as one process does (the class's ``decode``, tiled) and once with its tiles spread over the ranks
(``parallel.decode``). Rank 0 writes both videos to OUT_DIR/CASE.npz; every rank writes OUT_DIR/rank-R.json with
how many tiles its decoder computed in each spread decode (CASE) and in the one-process decode (CASE/one), and
what it raised when rank 1's decoder failed its share (failure)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import AutoencoderKLMiniMaxH3  # noqa: E402

from h3app.model.repo import locate  # noqa: E402
from h3app.parallel.decode import SpreadDecode, spread_decode  # noqa: E402
from h3app.parallel.group import RankGroup  # noqa: E402
from h3app.parallel.launch import close_ranks, start_ranks  # noqa: E402
from h3app.parallel.lockstep import on_every_rank  # noqa: E402
from h3app.parallel.topology import add_parallel_arguments  # noqa: E402

# name → (latent shape [B, C, T, H, W], tile size and minimum overlap in pixels (None: the released 256/64), dtype).
# The tiny VAE has 4 latent channels, 4× spatial and 4× temporal compression; 5 latent frames per clip.
CASES = {
    "released_tiles_3_clips": ((1, 4, 17, 8, 14), None, torch.float32),  # one tile per clip, 3 clips: 2 + 1
    "small_tiles_2_clips_24_tiles": ((1, 4, 12, 8, 10), (16, 8), torch.float32),  # 3 × 4 tiles per clip
    "small_tiles_padded_tail": ((1, 4, 9, 8, 10), (16, 8), torch.float32),  # latent frames repeated, then cut
    "one_tile_rank_1_idle": ((1, 4, 7, 4, 4), None, torch.float32),
    "bf16_decoder_small_tiles": ((1, 4, 12, 8, 10), (16, 8), torch.bfloat16),  # --vae-dtype bfloat16
}


def decode_calls(vae: AutoencoderKLMiniMaxH3) -> list[int]:
    """A counter of the decoder's real forwards (its last projection runs once per decoded tile)."""
    seen = [0]
    vae.decoder.proj_out.register_forward_hook(lambda *_: seen.__setitem__(0, seen[0] + 1))
    return seen


def share_fails_on_rank_1(vae: AutoencoderKLMiniMaxH3, group: RankGroup) -> dict[str, object]:
    """Rank 1's decoder fails its first tile; every rank runs the decode as a job does (``on_every_rank``) with
    the job's agreement between the passes. What this rank raised, and how long it took."""
    def fault(*_: object) -> None:
        if group.rank == 1:
            raise RuntimeError("injected decode fault on rank 1")

    handle = vae.decoder.register_forward_pre_hook(fault)
    z = torch.randn((1, 4, 12, 8, 10), generator=torch.Generator().manual_seed(5))
    started = time.monotonic()
    try:
        with torch.no_grad():
            on_every_rank(group, lambda: SpreadDecode(vae, group.step)(z))
        raised = None
    except Exception as error:  # noqa: BLE001 — reported to the test
        raised = [type(error).__name__, str(error)]
    finally:
        handle.remove()
    return {"raised": raised, "seconds": time.monotonic() - started}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    add_parallel_arguments(parser)
    args = parser.parse_args()
    args.device = "cpu"
    group = start_ranks(args)
    assert group is not None, "run with --ulysses 2"
    folder = str(locate("tiny").folder)
    vaes = {dtype: AutoencoderKLMiniMaxH3.from_pretrained(folder, subfolder="vae", torch_dtype=dtype).eval()
            for dtype in (torch.float32, torch.bfloat16)}
    counters = {dtype: decode_calls(vae) for dtype, vae in vaes.items()}
    tiles: dict[str, int] = {}
    try:
        for name, (shape, tiling, dtype) in CASES.items():
            vae = vaes[dtype]
            if tiling is None:
                vae.enable_tiling(256, 256, 64, 64)
            else:
                vae.enable_tiling(tiling[0], tiling[0], tiling[1], tiling[1])
            z = torch.randn(shape, generator=torch.Generator().manual_seed(len(name)))
            with torch.no_grad():
                counters[dtype][0] = 0
                one = type(vae).decode(vae, z).sample  # one process's tiled decode
                tiles[f"{name}/one"] = counters[dtype][0]
                spread_decode(vae)
                counters[dtype][0] = 0
                spread = vae.decode(z).sample
                tiles[name] = counters[dtype][0]
            if group.leader:
                np.savez(args.out / f"{name}.npz", one=one.float().numpy(), spread=spread.float().numpy(),
                         same_bytes=np.array(torch.equal(one, spread) and one.dtype == spread.dtype))
        tiles["failure"] = share_fails_on_rank_1(vaes[torch.float32], group)
        (args.out / f"rank-{group.rank}.json").write_text(json.dumps(tiles))
    finally:
        close_ranks(group)


if __name__ == "__main__":
    main()
