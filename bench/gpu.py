"""``python -m bench.gpu``: the full-size H3 transformer on one CUDA GPU (H100/H200, ≥ 80 GB) — one denoising step
at 544p and 768p with no LoRA, an unmerged and a merged rank-128 adapter, and the alpha re-apply times.

The transformer is diffusers' ``MiniMaxH3Transformer3DModel()`` with the published config (50 + 2 blocks, hidden
5376, 33.1 B parameters), built directly on the GPU in bf16 with random weights (61.7 GiB; the checkpoint's float32
islands — patch projections, timestep MLP, output heads, rope — stay float32 as ``from_pretrained`` keeps them), so
no 62 GB download is needed. The adapter is a LightX2V-shaped rank-128 file (624 tensors, 1.29 GiB bf16, alpha 8),
written once to the bench cache and loaded through h3app's normal path.

One denoising step is one transformer forward on a packed sequence of a real request's size
(``bench.models.sequence_rows``): 960×544 × 124 frames → 18,870 video + 414 audio + 256 text rows; 1344×768 → 37,296
video rows. Times use CUDA events around synchronised calls; the median of ``--repeats`` runs after a warm-up.

Reported, per resolution: peak GPU memory of one unmerged step beside the memory plan's prediction (the full-size
rehearsal on fake CUDA, ``h3app.hardware``); base forward; unmerged forward (ratio to base; theory ≈ 1.02); merged forward (≈ 1.0);
optionally PEFT's unmerged forward (``--peft``). Once: the equivalence pair (alpha 8 / strength 1 vs alpha 128 /
strength 0.0625) through h3app's transformer-mode check, which must be bit-identical in bf16 on CUDA; attach (read + normalise + bind), an unmerged alpha change,
a merged alpha re-apply (re-merge of 312 layers) with the pristine copies on the GPU and in pinned host RAM
(``bench.p5_merge.time_placements``; a placement the store refuses — no room for 37 GiB of copies on an 80 GB card —
is a row with the reason), and the switch to merged mode (copies + merge) before the merged steps. Needs ~70 GB of
GPU memory and ~40 GB of free host RAM for merged mode (else merged rows are skipped with the reason).

Refuses with exit status 2 and one line on stderr when no CUDA device is present.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from h3app.rules.choices import MERGED, UNMERGED
from h3app.rules.frames import RELEASED

from .gpu_common import ADAPTER, RANK, RESOLUTIONS, build_full_size, cuda_device, time_cuda, time_host

DEFAULT_FRAMES = RELEASED.frames(RELEASED.shortest_seconds)  # 5 s: 124 frames
NO_CUDA_MESSAGE = ("bench/gpu.py needs a CUDA GPU (H100/H200 class, >= 80 GB) and found none; "
                   "run `python -m bench` for the CPU benchmarks instead.")


def parse_resolutions(text: str) -> list[str]:
    """``"544p,768p"`` → ``["544p", "768p"]``; anything else is an error naming the choices."""
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in RESOLUTIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"resolutions are a comma-separated list of {', '.join(RESOLUTIONS)}; "
                                         f"got {text!r}")
    return list(dict.fromkeys(names))


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--resolutions", type=parse_resolutions, default=list(RESOLUTIONS), metavar="544p,768p")
    parser.add_argument("--frames", type=_positive, default=DEFAULT_FRAMES, help="pixel frames (17n+5; default 124)")
    parser.add_argument("--repeats", type=_positive, default=3, help="timed runs per measurement (default 3)")
    parser.add_argument("--text-rows", type=_positive, default=256, help="text rows in the packed sequence")
    parser.add_argument("--no-merged", action="store_true", help="skip merged mode (needs ~40 GB of host RAM)")
    parser.add_argument("--peft", action="store_true", help="also time PEFT's unmerged forward (diffusers loader)")
    parser.add_argument("--fuse-qkv", action="store_true", help="fuse q/k/v into to_qkv before attaching")
    parser.add_argument("--cache-dir", type=Path, default=None, help="adapter file cache (default as `python -m bench`)")
    parser.add_argument("--device", default="cuda", help="CUDA device (default cuda)")
    parser.add_argument("--decode", action="store_true",
                        help="only the video decode, float32 vs bfloat16 decoder, at 768x768 (bench/gpu_decode_cache.py)")
    parser.add_argument("--speed", action="store_true", help="only the ≤ 8-minute speed matrix (bench/gpu_speed.py): "
                                                             "predicted and measured steps, bf16/fp8 × eager/compiled")
    parser.add_argument("--calibration", action="store_true",
                        help="only the calibration table's one-card configurations (bench/gpu_calibration.py): the "
                             "published request's evaluation per attention backend and its decode per dtype, "
                             "beside the plan")
    return parser


Row = tuple[str, str, float, str]


@dataclass
class FullSizeBench:
    """The full-size transformer on the GPU, h3app's engine on it and the rank-128 LightX2V-layout file."""

    model: Any
    engine: Any
    path: Path
    shapes: Any
    settings: Any
    device: Any

    def attach(self) -> None:
        from h3app.adapters.normalise import load_adapter

        self.engine.attach(load_adapter(self.path, shapes=self.shapes), self.settings, ADAPTER)

    def reattach(self) -> None:
        self.engine.detach(ADAPTER)
        self.attach()

    def forward(self, batch: dict) -> Callable[[], Any]:
        import torch

        def call() -> Any:
            with torch.no_grad():
                return self.model(**batch)
        return call


def run(args: argparse.Namespace, device: Any) -> list[Row]:
    """The measurements as ``(what, resolution, seconds, note)`` rows."""
    bench, rows = build_bench(args, device)
    layers, attach = attach_rows(bench, args.repeats)
    rows += attach
    inputs = step_inputs(args, device)
    for name, (seq, batch) in inputs.items():
        rows += step_rows(bench, name, seq, batch, args)
        bench.attach()
    bench.engine.detach(ADAPTER)  # the check binds its own adapter on a bare transformer
    rows.append(equivalence_row(bench.model, bench.path, bench.shapes))
    bench.attach()
    if not args.no_merged:
        rows += merged_rows(bench, layers, inputs, args.repeats)
    bench.engine.detach()
    return rows


def build_bench(args: argparse.Namespace, device: Any) -> tuple[FullSizeBench, list[Row]]:
    """The adapter file (cached), the full-size transformer built on ``device`` and the build's row."""
    import torch

    from h3app.lora.engine import LoRAEngine
    from h3app.model.loader import fuse_qkv
    from h3app.rules.h3_modules import FULL_SIZE_CONFIG, transformer_shapes
    from h3app.settings import LoRASettings

    from .adapter_files import cached_adapter_file, default_cache_dir, lightx2v_layout

    path, _ = cached_adapter_file(args.cache_dir or default_cache_dir(), "lightx2v-full",
                                  lightx2v_layout(FULL_SIZE_CONFIG, RANK, torch.bfloat16), {"alpha": "8"})
    print(f"building the full-size transformer on {device} (bf16) …", file=sys.stderr, flush=True)
    started = time.perf_counter()
    model = build_full_size(device)
    if args.fuse_qkv:
        fuse_qkv(model)
    row = ("build full-size transformer on the GPU", "", time.perf_counter() - started,
           f"{sum(p.numel() for p in model.parameters()) / 1e9:.1f} B parameters")
    bench = FullSizeBench(model, LoRAEngine(model), path, transformer_shapes(FULL_SIZE_CONFIG),
                          LoRASettings(source=str(path), alpha=8.0), device)
    return bench, [row]


def attach_rows(bench: FullSizeBench, repeats: int) -> tuple[int, list[Row]]:
    """Attach (read + normalise + bind) and an unmerged alpha change, timed; the targets bound and the rows. Leaves
    the adapter attached at alpha 8."""
    bench.attach()
    layers = len(bench.engine.report(ADAPTER).matched)
    rows = [("attach (read + normalise + bind), unmerged", "", time_host(bench.reattach, repeats),
             f"{bench.path.name}: {layers} targets")]
    alpha = [8.0]

    def flip_alpha() -> None:
        alpha[0] = 16.0 if alpha[0] == 8.0 else 8.0
        bench.engine.set_lora(ADAPTER, alpha=alpha[0])

    rows.append(("alpha change, unmerged (set_lora)", "", time_host(flip_alpha, repeats), "O(1)"))
    return layers, rows


def step_inputs(args: argparse.Namespace, device: Any) -> dict[str, tuple[dict[str, int], dict]]:
    """Resolution → (its packed sequence's row counts, the transformer's inputs on ``device``)."""
    from .models import full_size_batch

    inputs = {}
    for name in args.resolutions:
        height, width = RESOLUTIONS[name]
        inputs[name] = full_size_batch(height, width, args.frames, args.text_rows, device)
    return inputs


def step_rows(bench: FullSizeBench, name: str, seq: dict[str, int], batch: dict, args: argparse.Namespace
              ) -> list[Row]:
    """One resolution: the measured peak against the plan, a step unmerged, without LoRA and (``--peft``) with PEFT.
    Leaves the adapter detached."""
    import torch

    from h3app.rules.h3_modules import FULL_SIZE_CONFIG

    from .p4_forward import theoretical_ratio

    forward = bench.forward(batch)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(bench.device)
    forward()
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated(bench.device)
    predicted = planned_step_bytes(name, args.fuse_qkv)
    rows = [("peak GPU memory, one unmerged step (measured)", name, float("nan"),
             f"{measured / 2**30:.1f} GiB; plan {predicted / 2**30:.1f} GiB ({measured / predicted:.2f}× the plan)")]
    tokens = seq["video"] + seq["audio"] + seq["text"]
    theory = theoretical_ratio(FULL_SIZE_CONFIG, tokens, seq["text"])
    print(f"{name}: {tokens} tokens …", file=sys.stderr, flush=True)
    unmerged = time_cuda(forward, args.repeats)
    bench.engine.detach(ADAPTER)
    base = time_cuda(forward, args.repeats)
    rows.append(("one denoising step, no LoRA", name, base, f"{tokens:,} tokens"))
    rows.append(("one denoising step, unmerged rank 128", name, unmerged,
                 f"{unmerged / base:.3f}× base (theory {theory:.3f}×, goal ≤ 1.1×)"))
    if args.peft:
        from .peers import diffusers_attach, diffusers_detach, quiet_diffusers

        quiet_diffusers()
        diffusers_attach(bench.model, bench.path)
        peft = time_cuda(forward, args.repeats)
        diffusers_detach(bench.model)
        rows.append(("one denoising step, PEFT unmerged rank 128", name, peft,
                     f"ours / PEFT = {unmerged / peft:.3f}× (goal ≤ 1×)"))
    return rows


def merged_rows(bench: FullSizeBench, layers: int, inputs: dict[str, tuple[dict[str, int], dict]], repeats: int
                ) -> list[Row]:
    """Merged mode: alpha re-apply per pristine placement, the switch, a step per resolution; or why it was
    skipped. Leaves the engine unmerged."""
    import torch

    from h3app.errors import H3AppError

    rows = placement_rows(bench.engine, layers, lambda change: time_host(change, repeats))
    try:
        started = time.perf_counter()
        bench.engine.set_mode(MERGED)
        torch.cuda.synchronize()
        rows.append(("switch to merged (pristine copies + merge)", "", time.perf_counter() - started,
                     f"copies of the weights of {layers} targets, placed by the store's auto rule"))
        for name, (_, batch) in inputs.items():
            rows.append(("one denoising step, merged", name, time_cuda(bench.forward(batch), repeats),
                         "no per-forward overhead expected"))
        bench.engine.set_mode(UNMERGED)
    except H3AppError as error:
        rows.append(("merged mode", "", float("nan"), f"skipped: {error}"))
    return rows


def placement_rows(engine: Any, layers: int, timer: Callable[[Callable[[], Any]], float]) -> list[Row]:
    """Merged mode's alpha re-apply with the pristine copies on the device, then in pinned host RAM
    (``bench.p5_merge.time_placements``): one row each, or the refusal (e.g. no room for the copies on the GPU).
    Leaves ``engine`` unmerged at alpha 8."""
    from .p5_merge import time_placements

    where = {"device": "on the GPU", "ram": "in pinned host RAM"}
    rows = []
    for placement, result in time_placements(engine, ADAPTER, timer).items():
        what = f"alpha re-apply, merged, pristine copies {where.get(placement, placement)}"
        if isinstance(result, str):
            rows.append((what, "", float("nan"), f"refused: {result}"))
        else:
            rows.append((what, "", float(result), f"{layers} targets re-merged"))
    return rows


def planned_step_bytes(resolution: str, fuse_qkv: bool) -> int:
    """The plan's device bytes for what the bench holds in one step: transformer weights + the adapter's fp32
    factors + the step's transient (the full-size rehearsal on fake CUDA, same canvas, rank 128)."""
    from h3app.hardware.header_adapter import lightx2v_header
    from h3app.hardware.planner import measure
    from h3app.hardware.rehearsal import RehearsalOptions
    from h3app.rules.choices import MAIN_PARTITION
    from h3app.rules.h3_modules import FULL_SIZE_CONFIG, transformer_shapes

    header = lightx2v_header(transformer_shapes(FULL_SIZE_CONFIG), rank=RANK, alpha=8.0)
    measured = measure(RehearsalOptions(resolution=resolution, adapter=header, fuse_qkv=fuse_qkv))
    return measured.weights[MAIN_PARTITION] + measured.lora_bytes + measured.rehearsal.phases["denoise"].transient


def equivalence_row(model: Any, path: Path, shapes: Any) -> Row:
    """h3app's transformer-mode check on the full-size model: alpha 8 / strength 1 vs alpha 128 / strength 0.0625
    must be bit-identical in bf16 on CUDA (deterministic algorithms, native attention)."""
    from h3app.adapters.normalise import load_adapter
    from h3app.backend.transformer_check import run_transformer_check
    from h3app.rules.check_pair import DEFAULT_A, DEFAULT_B

    started = time.perf_counter()
    check = run_transformer_check(model, load_adapter(path, shapes=shapes), a=DEFAULT_A, b=DEFAULT_B)
    verdict = "bit-identical" if check["identical"] else f"DIFFERENT (max |Δ| {check['max_abs_diff']:.3g})"
    return ("equivalence pair 8:1.0 vs 128:0.0625 (transformer mode)", "", time.perf_counter() - started,
            f"{verdict}; control {'identical' if check['control_identical'] else 'DIFFERENT'}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    device = cuda_device(args.device)
    if device is None:
        print(NO_CUDA_MESSAGE, file=sys.stderr)
        return 2
    import os

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic GEMMs for the equivalence pair
    import torch

    properties = torch.cuda.get_device_properties(device)
    print(f"## h3app GPU benchmark\n\nGPU: {properties.name}, {properties.total_memory / 2**30:.0f} GiB; torch "
          f"{torch.__version__}; frames {args.frames}; rank {RANK}; fused QKV {args.fuse_qkv}.\n")
    if args.decode:
        from .gpu_decode_cache import run_decode

        print(run_decode(args, device))
        return 0
    if args.speed:
        from .gpu_speed import run_speed

        print(run_speed(args, device))
        return 0
    if args.calibration:
        from .gpu_calibration import run_calibration

        print(run_calibration(args, device))
        return 0
    rows = run(args, device)
    torch.cuda.empty_cache()  # the one-GPU model is gone; the 2-GPU section builds its own per rank
    from .gpu_parallel import two_gpu_rows

    one_gpu_base = {r: s for what, r, s, _ in rows if what == "one denoising step, no LoRA"}
    rows += two_gpu_rows(args.resolutions, frames=args.frames, text_rows=args.text_rows, repeats=args.repeats,
                         one_gpu_base=one_gpu_base, cache_dir=str(args.cache_dir) if args.cache_dir else None)
    print("| what | resolution | median | note |\n|---|---|---|---|")
    for what, resolution, seconds, note in rows:
        shown = "—" if math.isnan(seconds) else (f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s")
        print(f"| {what} | {resolution or '—'} | {shown} | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
