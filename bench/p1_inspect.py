"""P1 — inspect a full-size LightX2V-shaped adapter (rank 128, 624 tensors, 1.29 GiB bf16) vs loading it.

Ours: ``h3app.adapters.inspect.inspect_file`` (header + 0-dim scalars: format, rank, alpha and its source, targets).
Peers: ``safetensors.torch.load_file`` of the same file — which in safetensors 0.8 maps the file and returns
tensors backed by the map, so by itself it reads little — and ``load_file`` plus one pass that reads every tensor
(``tensor.sum()``), which is what a loader that looks at the weights pays: the read limit.

``--quick`` uses the full-size file when it is already cached, else a rank-8 file with the same 624 keys (the row
says which): inspection cost does not depend on the rank, reading does.
"""

from __future__ import annotations

from .adapter_files import adapter_file_path, cached_adapter_file, is_cached, lightx2v_layout
from .context import BenchContext
from .table import Goal, Row
from .timing import measure

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
    from h3app.model.shapes import FULL_SIZE_CONFIG

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

    ours = measure(lambda: inspect_file(path), repeats=ctx.repeats, warmup=2)
    lazy = measure(lambda: load_file(path), repeats=ctx.repeats, warmup=1)
    read = measure(lambda: read_every_tensor(load_file(path)), repeats=ctx.heavy_repeats, warmup=1)
    which = (f"rank {rank}, {len(specs)} tensors, {size_gib:.2f} GiB bf16"
             + ("" if rank == FULL_RANK else " (quick: the full-size file is not cached yet; same keys, smaller)"))
    goal = Goal("≤ 50 ms and ≤ 1/50", max_ratio=1 / 50, max_seconds=0.050)
    return [
        Row(CASE, "inspect full-size LightX2V file", ours.median, "load_file (safetensors 0.8: lazy)", lazy.median,
            goal, f"{which}; load_file maps the file and returns tensors backed by the map, reading almost none of "
                  "it, so this compares two header reads"),
        Row(CASE, "inspect full-size LightX2V file", ours.median, "load_file + read every tensor", read.median,
            goal, "the read limit: what any loader that looks at the weights pays; page cache warm on both sides"),
    ]
