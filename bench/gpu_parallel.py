"""The 2-GPU section of the GPU benchmark: one denoising step of the full-size H3 transformer split over two GPUs
with context parallel (Ulysses 2, h3app's own ``parallelize``), with no LoRA and with an unmerged rank-128 adapter.

``two_gpu_rows(...)`` returns ``(what, resolution, seconds, note)`` rows like ``bench.gpu.run``; pass the one-GPU
base step times (``{"544p": seconds}``) to get the speed-up in the note (goal: well above 1×, at most 2×). Each
GPU holds the whole bf16 transformer (~62 GiB): it needs two ≥ 80 GB GPUs and says so in one row otherwise. Runs
two spawned processes (nccl for tensors, gloo for small messages). ``python -m bench.gpu_parallel`` prints the rows.
"""

from __future__ import annotations

import argparse
import math
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

Row = tuple[str, str, float, str]
RANKS = 2


def two_gpu_rows(resolutions: Sequence[str] = ("544p",), *, frames: int = 124, text_rows: int = 256,
                 repeats: int = 3, one_gpu_base: Mapping[str, float] | None = None,
                 cache_dir: str | None = None) -> list[Row]:
    """The section's rows; a single "skipped" row (seconds NaN) when fewer than two CUDA GPUs are visible."""
    import torch
    import torch.multiprocessing as mp

    found = torch.cuda.device_count()
    if found < RANKS:
        return [("2-GPU context parallel (Ulysses 2)", "", math.nan, f"skipped: needs {RANKS} CUDA GPUs, found {found}")]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    params = {"resolutions": list(resolutions), "frames": frames, "text_rows": text_rows, "repeats": repeats,
              "cache_dir": cache_dir, "port": port}
    processes = [context.Process(target=_rank_main, args=(rank, params, queue)) for rank in range(RANKS)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    rows: list[Row] = []
    while not queue.empty():
        kind, payload = queue.get()
        if kind == "error":
            return [("2-GPU context parallel (Ulysses 2)", "", math.nan, f"failed: {payload}")]
        rows.append(payload)
    for index, (what, resolution, seconds, note) in enumerate(rows):
        if what.startswith("one denoising step, no LoRA") and one_gpu_base and resolution in one_gpu_base:
            rows[index] = (what, resolution, seconds, f"{note}; {one_gpu_base[resolution] / seconds:.2f}× one GPU")
    return rows


def _rank_main(rank: int, params: dict[str, Any], queue: Any) -> None:
    try:
        rows = _measure(rank, params)
    except Exception as error:  # reported as the section's one row; the other rank fails with it
        if rank == 0:
            queue.put(("error", f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"))
        return
    if rank == 0:
        for row in rows:
            queue.put(("row", row))


def _measure(rank: int, params: dict[str, Any]) -> list[Row]:
    import torch
    import torch.distributed as dist

    from h3app.adapters.normalise import load_adapter
    from h3app.lora.engine import LoRAEngine
    from h3app.parallel.context_parallel import parallelize
    from h3app.parallel.topology import ParallelSpec
    from h3app.rules.h3_modules import FULL_SIZE_CONFIG, transformer_shapes
    from h3app.settings import LoRASettings

    from .adapter_files import cached_adapter_file, default_cache_dir, lightx2v_layout
    from .gpu_common import ADAPTER, RANK, RESOLUTIONS, build_full_size, time_cuda
    from .models import full_size_batch

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"tcp://127.0.0.1:{params['port']}", rank=rank,
                            world_size=RANKS)
    try:
        path, _ = cached_adapter_file(params["cache_dir"] or default_cache_dir(), "lightx2v-full",
                                      lightx2v_layout(FULL_SIZE_CONFIG, RANK, torch.bfloat16), {"alpha": "8"})
        model = build_full_size(device)
        parallelize(model, ParallelSpec(ulysses=RANKS))
        engine = LoRAEngine(model)
        adapter = load_adapter(path, shapes=transformer_shapes(FULL_SIZE_CONFIG))
        rows: list[Row] = []
        for name in params["resolutions"]:
            height, width = RESOLUTIONS[name]
            seq, batch = full_size_batch(height, width, params["frames"], params["text_rows"], device)

            def forward(batch: dict = batch) -> Any:  # bound now: called within this iteration
                with torch.no_grad():
                    return model(**batch)

            tokens = seq["video"] + seq["audio"] + seq["text"]
            base = time_cuda(forward, params["repeats"])
            engine.attach(adapter, LoRASettings(source=str(path), alpha=8.0), ADAPTER)
            unmerged = time_cuda(forward, params["repeats"])
            engine.detach(ADAPTER)
            peak = torch.cuda.max_memory_allocated(device) / 1024**3
            rows.append(("one denoising step, no LoRA, Ulysses 2", name, base,
                         f"{tokens:,} tokens, {math.ceil(tokens / RANKS):,} rows per GPU, peak {peak:.1f} GiB"))
            rows.append(("one denoising step, unmerged rank 128, Ulysses 2", name, unmerged,
                         f"{unmerged / base:.3f}× base on the same 2 GPUs"))
        return rows
    finally:
        dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_parallel", description=__doc__.split("\n\n")[0])
    parser.add_argument("--resolutions", default="544p", help="comma-separated: 544p,768p")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rows = two_gpu_rows([r.strip() for r in args.resolutions.split(",") if r.strip()], repeats=args.repeats)
    for what, resolution, seconds, note in rows:
        print(f"{what:52s} {resolution:5s} {seconds:9.3f} s  {note}")
    return 0 if all(not math.isnan(row[2]) for row in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
