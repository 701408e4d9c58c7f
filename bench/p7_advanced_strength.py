"""P7 — what advanced strength costs per denoising step: per-modality factors (each LoRA delta scaled per token row
by its tag, the AdaLN delta per modality block), a strength schedule (the scale tensors refilled before every
evaluation) and per-block factors, against the same adapter unmerged without them.

Two measurements:

- **CPU, tiny checkpoint**: one evaluation of the embedded tiny transformer (inside the per-evaluation events, as a
  generation runs it) with the demo style adapter, timed interleaved against the plain unmerged step.
- **fake CUDA, full size**: one evaluation of the 33B transformer (bf16) on a 544p, 124-frame request (18,870 video
  + 414 audio + 256 text rows) with a rank-128 adapter on every attention, feed-forward and AdaLN Linear (362
  targets), unmerged. Every aten op the GPU would run is counted on fake tensors (no values): its FLOPs (torch's
  ``flop_counter`` formulas) and the bytes it reads and writes (inputs and outputs; views move nothing). A per-kernel
  roofline turns them into seconds on an H200: ``max(FLOPs / GEMM rate(dtype), bytes / streaming bandwidth)`` (the
  plan's published efficiencies, ``Peaks.gemm_flops_per_s`` and ``memory_bytes_per_s``) plus
  ``LAUNCH_S`` per kernel, and a host→device copy costs ``COPY_S`` plus its bytes over the host link. The goal is on
  the ratio to the plain unmerged step (``≤ 1.03×``), predicted, not measured on a GPU.
"""

from __future__ import annotations

import time
from typing import Any

from .context import BenchContext
from .table import Goal, Row
from .timing import Variant, compare

CASE = "P7"
RANK = 128
GPU = "H200"
LAUNCH_S = 4e-6  # one eager CUDA kernel launch (a few µs; counted as if none overlapped the next kernel)
COPY_S = 10e-6  # one small synchronous host→device copy (a schedule's refill of one scale tensor)
STYLE = "assets/adapters/tiny_style_warm.safetensors"
MODALITY = {"video_strength": 1.0, "text_strength": 1.0, "audio_strength": 0.0}
# The first evaluation's factor is not 1, so its refill is counted (the end-of-run refill back to 1 is not: once
# per run, after the counted evaluation).
SCHEDULED = {**MODALITY, "strength_schedule": "cosine:0.8:0.4", "block_strength": "0-9:0.5,40-49:1.2"}


# ----------------------------------------------------------------------------------------------- counting ops
def op_counter() -> Any:
    """A dispatch mode recording, per op that touches a (fake) CUDA tensor, ``(flops, bytes, dtype)``; host→device
    copies are recorded apart (``copies``: bytes each)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import flop_registry

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.kernels: list[tuple[int, int, str]] = []
            self.copies: list[int] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func.is_view or func._overloadpacket in (torch.ops.aten.detach, torch.ops.aten.lift_fresh):
                return out
            inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            devices = {t.device.type for t in (*inputs, *outputs)}
            if not outputs or "cuda" not in devices:  # metadata queries (prim.device) and host work
                return out
            if func._overloadpacket is torch.ops.aten.copy_ and "cpu" in devices:
                self.copies.append(sum(t.nbytes for t in outputs))
                return out
            formula = flop_registry.get(func._overloadpacket)
            flops = int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0
            moved = sum(t.numel() * t.element_size() for t in (*inputs, *outputs))
            dtype = str((inputs or outputs)[0].dtype).replace("torch.", "")
            self.kernels.append((flops, moved, dtype))
            return out

    return Ops()


def predicted_seconds(ops: Any) -> dict[str, float]:
    """The per-kernel roofline of ``ops`` on ``GPU``: total seconds, kernels, and the parts."""
    from h3app.hardware.roofline import PEAKS

    peaks = PEAKS[GPU]
    compute = memory = total = 0.0
    for flops, moved, dtype in ops.kernels:
        c, m = flops / peaks.gemm_flops_per_s(dtype), moved / peaks.memory_bytes_per_s
        compute, memory, total = compute + c, memory + m, total + max(c, m) + LAUNCH_S
    copies = sum(COPY_S + nbytes / peaks.host_bytes_per_s for nbytes in ops.copies)
    return {"seconds": total + copies, "kernels": len(ops.kernels), "copies": len(ops.copies), "copy_s": copies,
            "compute_s": compute, "memory_s": memory}


def full_size_header(shapes: Any, rank: int = RANK) -> Any:
    """A header (no bytes) with bf16 rank-``rank`` pairs on every attention, feed-forward and AdaLN Linear of the
    main and refiner blocks, alpha 8 in the metadata."""
    import torch

    from h3app.adapters.header import make_header_view
    from h3app.rules.h3_modules import is_block_linear

    tensors, offset = {}, 0
    for target, linear in shapes.linears.items():
        if not (is_block_linear(target) or target.endswith(".adaln_proj.linear")):
            continue
        for key, shape in ((f"{target}.lora_A.weight", (rank, linear.in_features)),
                           (f"{target}.lora_B.weight", (linear.out_features, rank))):
            nbytes = shape[0] * shape[1] * torch.bfloat16.itemsize
            tensors[key] = ("BF16", shape, (offset, offset + nbytes))
            offset += nbytes
    return make_header_view(tensors, {"alpha": "8"}, {}, None, offset, "p7_full_size.safetensors")


def count_full_size(ctx: BenchContext, num_layers: int) -> dict[str, dict[str, float]]:
    """One evaluation of the full-width transformer (``num_layers`` blocks) per variant, counted on fake CUDA."""
    import torch

    from bench.models import packed_input, sequence_rows
    from h3app.hardware import full_size
    from h3app.hardware.fake_cuda import fake_cuda
    from h3app.hardware.header_adapter import adapter_from_header
    from h3app.lora.engine import LoRAEngine
    from h3app.lora.evaluations import RunSchedule, evaluation_events
    from h3app.model.loader import LoadOptions
    from h3app.rules.choices import MAIN_PARTITION
    from h3app.rules.h3_modules import transformer_shapes
    from h3app.settings import LoRASettings

    config = {**full_size.transformer_config(), "num_layers": num_layers}
    ctx.log(f"P7: building the full-width transformer ({num_layers} blocks) on fake CUDA …")
    model = full_size.build_meta(MAIN_PARTITION, LoadOptions(dtype=torch.bfloat16), config)
    rows = sequence_rows(544, 960, 124)
    results: dict[str, dict[str, float]] = {}
    with fake_cuda():
        model.to_empty(device="cuda")
        shapes = transformer_shapes(dict(model.config))
        engine = LoRAEngine(model)
        engine.attach(adapter_from_header(full_size_header(shapes), shapes), LoRASettings(source="p7"), "p7")
        inputs = packed_input(dict(model.config), video_grid=(rows["latent_frames"], rows["grid_h"], rows["grid_w"]),
                              audio_steps=rows["audio_steps"], text_rows=rows["text"], device="cuda")
        schedule = RunSchedule.of(9, 12.0, 3.0)
        for name, fields in (("plain", {}), ("modality", MODALITY), ("scheduled", SCHEDULED)):
            blocks = fields.get("block_strength", "")
            if blocks and num_layers < 50:
                fields = {**fields, "block_strength": f"0-{min(9, num_layers - 1)}:0.5"}
            engine.set_lora("p7", advanced=LoRASettings(source="p7", **fields))
            started = time.perf_counter()
            ops = op_counter()
            with torch.no_grad(), evaluation_events(model, schedule), ops:
                model(**inputs)
            results[name] = predicted_seconds(ops)
            ctx.log(f"P7: {name}: {results[name]['kernels']} kernels, {results[name]['copies']} host copies "
                    f"({time.perf_counter() - started:.0f} s)")
        engine.detach()
    return results


# ----------------------------------------------------------------------------------------------- CPU, tiny
def time_tiny(ctx: BenchContext) -> dict[str, Any]:
    """One evaluation of the tiny checkpoint per variant, timed interleaved (CPU clock)."""
    import torch

    from h3app.adapters.normalise import load_adapter
    from h3app.backend.transformer_check import packed_check_input
    from h3app.lora.engine import LoRAEngine
    from h3app.lora.evaluations import RunSchedule, evaluation_events
    from h3app.model.loader import load_transformer
    from h3app.rules.h3_modules import transformer_shapes
    from h3app.settings import LoRASettings

    from .models import shared_weight_copy

    base = load_transformer("tiny", dtype=torch.float32)
    adapter = load_adapter(STYLE, shapes=transformer_shapes(dict(base.config)))
    models = {}
    for name, fields in (("plain", {}), ("modality", MODALITY), ("scheduled", {**SCHEDULED, "block_strength": "0:0.5"})):
        models[name] = shared_weight_copy(base)
        LoRAEngine(models[name]).attach(adapter, LoRASettings(source=STYLE, **fields), name)
    inputs = packed_check_input(base.config, seed=0)
    schedule = RunSchedule.of(9, 12.0, 3.0)

    def evaluation(model: torch.nn.Module):
        def call() -> None:
            with torch.no_grad(), evaluation_events(model, schedule):
                model(**inputs)
        return call

    return compare([Variant(name, evaluation(model), inner=20) for name, model in models.items()],
                   repeats=ctx.repeats, warmup=2, clock=ctx.clock("cpu"))


def run(ctx: BenchContext) -> list[Row]:
    timings = time_tiny(ctx)
    num_layers = 10 if ctx.quick else 50
    counted = count_full_size(ctx, num_layers)
    rows: list[Row] = []
    for name, label in (("modality", "audio strength 0"), ("scheduled", "audio 0 + cosine schedule + block ranges")):
        rows.append(Row(CASE, f"one tiny evaluation, CPU, style adapter unmerged, {label}", timings[name].median,
                        "plain unmerged evaluation", timings["plain"].median, Goal("— (CPU tiny: overheads)"),
                        f"best-of ratio {timings[name].best / timings['plain'].best:.3f}×", ctx.clock("cpu")))
        ours, plain = counted[name], counted["plain"]
        extra = {key: {"ours": ours[key], "plain": plain[key]} for key in ("kernels", "copies", "copy_s")}
        rows.append(Row(CASE, f"one evaluation at full width ({num_layers} blocks), 544p, rank {RANK} unmerged, "
                              f"{label}: predicted on an {GPU}", ours["seconds"], "plain unmerged evaluation",
                        plain["seconds"], Goal("≤ 1.03×", max_ratio=1.03),
                        f"counted on fake CUDA: {ours['kernels'] - plain['kernels']:+d} kernels, "
                        f"{ours['copies'] - plain['copies']:+d} host copies (the evaluation's refill of the "
                        f"scale tensors)", "predicted", extra=extra))
    return rows

