"""P1 — inspect a full-size LightX2V-shaped adapter (rank 128, 624 tensors, 1.29 GiB bf16) vs loading it.

Ours: ``h3app.adapters.inspect.inspect_file`` (header + 0-dim scalars: format, rank, alpha and its source, targets),
at a first look (the process's memo cleared before each run) and again on the unchanged file (remembered).
Goal: ≤ 1/25 of reading the file from a warm page cache.
Peers: ``safetensors.torch.load_file`` of the same file — which in safetensors 0.8 maps the file and returns
tensors backed by the map, so by itself it reads little — and ``load_file`` plus one pass that reads every tensor
(``tensor.sum()``), which is what a loader that looks at the weights pays: the read limit, measured with the page
cache warm (the file was just written or downloaded) and cold (this file's pages evicted with ``posix_fadvise``
before each run: a first look at a file on disk).

``--quick`` uses the full-size file when it is already cached, else a rank-8 file with the same 624 keys (the row
says which): inspection cost does not depend on the rank, reading does.
"""

from __future__ import annotations

import os

from .adapter_files import (
    adapter_file_path,
    cached_adapter_file,
    is_cached,
    lightx2v_layout,
)
from .context import BenchContext
from .table import Goal, Row
from .timing import Variant, compare

CASE = "P1"
FULL_RANK = 128
QUICK_RANK = 8


def read_every_tensor(state_dict) -> float:
    """One pass over every byte of every tensor (the read limit's "touch")."""
    return sum(float(tensor.sum()) for tensor in state_dict.values())


def run(ctx: BenchContext) -> list[Row]:
    import torch
    from safetensors.torch import load_file

    from h3app.adapters.inspect import inspect_file
    from h3app.rules.h3_modules import FULL_SIZE_CONFIG

    metadata = {"alpha": "8"}
    full_specs = lightx2v_layout(FULL_SIZE_CONFIG, FULL_RANK, torch.bfloat16)
    rank = FULL_RANK
    specs = full_specs
    if ctx.quick and not is_cached(adapter_file_path(ctx.cache_dir, "lightx2v-full", full_specs, metadata),
                                   full_specs, metadata):
        rank = QUICK_RANK
        specs = lightx2v_layout(FULL_SIZE_CONFIG, QUICK_RANK, torch.bfloat16)
    stem = "lightx2v-full" if rank == FULL_RANK else f"lightx2v-full-r{rank}"
    ctx.log(f"P1: adapter file (rank {rank}, {len(specs)} tensors) in {ctx.cache_dir} …")
    path, written = cached_adapter_file(ctx.cache_dir, stem, specs, metadata)
    size_gib = path.stat().st_size / 2**30
    if written:
        ctx.log(f"P1: wrote {path} ({size_gib:.2f} GiB)")

    info = inspect_file(path)
    if info.rank != rank or len(info.targets) != len(specs) // 2 or info.alpha != 8.0:
        raise RuntimeError(f"P1: inspect read rank {info.rank}, {len(info.targets)} targets, alpha {info.alpha}; "
                           f"expected {rank}, {len(specs) // 2}, 8")

    from h3app.adapters import memo

    def first_look():
        memo.clear()  # forget earlier inspections: this is the first look at the file in this process
        return inspect_file(path)

    variants = [Variant("first", first_look),
                Variant("again", lambda: inspect_file(path), inner=100),
                Variant("lazy", lambda: load_file(path)),
                Variant("read", lambda: read_every_tensor(load_file(path)))]
    clock = ctx.clock("cpu")
    warm = compare(variants, repeats=ctx.repeats, warmup=2, clock=clock)
    which = (f"rank {rank}, {len(specs)} tensors, {size_gib:.2f} GiB bf16"
             + ("" if rank == FULL_RANK else " (quick: the full-size file is not cached yet; same keys, smaller)"))
    goal = Goal("≤ 1/25", max_ratio=1 / 25)
    rows = [
        Row(CASE, "inspect full-size LightX2V file (first look)", warm["first"].median,
            "load_file + read every tensor (page cache warm)", warm["read"].median, goal,
            f"{which}; header + 0-dim scalars, plan, alpha chain, fit; the read limit when the file was just "
            "downloaded or read", clock),
        Row(CASE, "inspect it again (unchanged: remembered)", warm["again"].median,
            "load_file + read every tensor (page cache warm)", warm["read"].median, goal,
            "a stat of the file and its adapter_config.json, then two look-ups (memo per path, inode, size, mtime)",
            clock),
        Row(CASE, "inspect full-size LightX2V file (first look)", warm["first"].median,
            "load_file (safetensors 0.8: lazy)", warm["lazy"].median, Goal("none (context)"),
            "load_file maps the file and returns tensors backed by the map, reading almost none of it, so this "
            "compares two header reads (no goal)", clock),
    ]
    if hasattr(os, "posix_fadvise"):
        def evict() -> None:
            evict_from_page_cache(path)
            memo.clear()

        cold = compare([Variant("ours", lambda: inspect_file(path), setup=evict),
                        Variant("read", lambda: read_every_tensor(load_file(path)), setup=evict)],
                       repeats=ctx.heavy_repeats, warmup=0, clock=ctx.clock("wall"))
        rows.append(Row(CASE, "inspect full-size LightX2V file, cold", cold["ours"].median,
                        "load_file + read every tensor (cold)", cold["read"].median, goal,
                        "this file's pages evicted from the page cache (posix_fadvise DONTNEED) before each run: "
                        "a first look at a file on disk", ctx.clock("wall")))
    return rows


def evict_from_page_cache(path) -> None:
    """Drop ``path``'s clean pages from the OS page cache (only this file; other processes are unaffected)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)
