"""``python -m bench.gpu --speed``: one denoising step per variant, measured beside the plan's roofline prediction,
the whole script within 8 minutes (the matrix gets ``BUDGET_S``, the rehearsal and the build the rest).

Then the step cache's rows (``bench/gpu_decode_cache.py``): one evaluation with every block and one the first-block
cache skips, each beside its prediction. Variants: bf16 and fp8 storage (diffusers' ``enable_layerwise_casting``, compute in bf16) × eager and compiled
(``h3app.model.compiled``: the blocks through ``torch.compile``) × no LoRA, unmerged and merged rank 128. fp8 with
merged LoRA is refused (a merge would round into fp8) and shown as such. The prediction is
``h3app.hardware.roofline.step_seconds`` for this GPU's spec-sheet peaks, on the counts of the full-size rehearsal
(fake CUDA, 544p); it does not model compilation, so eager and compiled rows share it. ``measured / predicted``
checks the efficiencies (docs/hardware.md: GEMM, streaming, attention): the first GPU run says how far they are off. A row the budget leaves
no time for says so instead of a time.

The row building (``speed_rows``) runs anywhere; only the measuring needs CUDA (``tests/test_bench_smoke.py`` runs
the measuring on the CPU with the tiny model).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from h3app.rules.choices import MERGED, UNMERGED

BUDGET_S = 360.0  # the matrix; with the rehearsal and the build the script stays within 8 minutes
PRECISIONS = ("bf16", "fp8")
MODES = ("eager", "compiled")
LORAS = ("none", UNMERGED, MERGED)
VARIANTS: tuple[tuple[str, str, str], ...] = tuple((p, m, lora) for p in PRECISIONS for m in MODES for lora in LORAS)
REFUSED = {("fp8", MERGED): "refused: fp8 storage keeps LoRA exact only unmerged"}


@dataclass
class SpeedRow:
    """One variant: predicted and measured seconds of one step (None where there is none, ``note`` says why)."""

    precision: str
    mode: str
    lora: str
    predicted_s: float | None
    measured_s: float | None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """measured / predicted (how far off the roofline is), None without both."""
        if self.predicted_s and self.measured_s is not None:
            return self.measured_s / self.predicted_s
        return None


def predicted_steps(measured_plan: Any, gpu_name: str) -> dict[tuple[str, str], float | None]:
    """``(precision, lora)`` → the roofline's seconds per step on ``gpu_name`` (None: no spec-sheet peaks for it).
    ``measured_plan``: the planner's ``Measured`` of an unmerged rank-128 rehearsal."""
    from h3app.hardware.planner import Placement
    from h3app.hardware.roofline import peaks_for_device, step_seconds

    peaks = peaks_for_device(gpu_name)
    out: dict[tuple[str, str], float | None] = {}
    for precision in PRECISIONS:
        placement = Placement("none", fp8=precision == "fp8")
        for lora in LORAS:
            refused = (precision, lora) in REFUSED
            out[(precision, lora)] = None if peaks is None or refused else \
                step_seconds(measured_plan, placement, peaks, None if lora == "none" else lora)
    return out


def speed_rows(predicted: dict[tuple[str, str], float | None], measured: dict[tuple[str, str, str], float | str]
               ) -> list[SpeedRow]:
    """One row per variant: its prediction and its measurement (seconds), or the reason it has none (a string)."""
    rows = []
    for precision, mode, lora in VARIANTS:
        got = measured.get((precision, mode, lora), "not measured")
        note = REFUSED.get((precision, lora), "" if isinstance(got, float) else str(got))
        rows.append(SpeedRow(precision, mode, lora, predicted.get((precision, lora)),
                             got if isinstance(got, float) else None, note))
    return rows


def table(rows: list[SpeedRow]) -> str:
    """The markdown table: predicted and measured side by side, then their ratio."""
    def shown(seconds: float | None) -> str:
        return "—" if seconds is None else f"{seconds:.3f} s"

    lines = ["| precision | mode | LoRA | predicted step | measured step | measured / predicted | note |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "—" if r.ratio is None else f"{r.ratio:.2f}×"
        lines.append(f"| {r.precision} | {r.mode} | {r.lora} | {shown(r.predicted_s)} | {shown(r.measured_s)} | "
                     f"{ratio} | {r.note} |")
    return "\n".join(lines)


def measure_steps(model: Any, engine: Any, attach: Callable[[], None], step: Callable[[], Any],
                  timer: Callable[[Callable[[], Any]], float], device: Any, budget_s: float = BUDGET_S,
                  modes: tuple[str, ...] = MODES) -> dict[tuple[str, str, str], float | str]:
    """Time ``step`` (one transformer forward) in every variant on ``model``; ``engine`` is its LoRA engine and
    ``attach()`` binds the adapter unmerged. Runs bf16 eager, bf16 compiled, then turns on fp8 storage (for good:
    the weights are cast in place) and runs fp8 eager and compiled (``modes``: a subset). Past ``budget_s`` the rest
    is skipped."""
    from h3app.model.compiled import compile_blocks, uncompile_blocks

    started = time.perf_counter()
    out: dict[tuple[str, str, str], float | str] = {}

    def timed(key: tuple[str, str, str]) -> None:
        if time.perf_counter() - started > budget_s:
            out[key] = f"skipped: past the {budget_s:.0f} s budget"
            return
        out[key] = float(timer(step))

    for precision in PRECISIONS:
        if precision == "fp8":
            import torch

            engine.detach()
            uncompile_blocks(model)  # back to eager before the casting hooks go in
            model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
        for mode in modes:
            if mode == "compiled":
                compile_blocks(model, device)
            engine.detach()
            timed((precision, mode, "none"))
            attach()
            timed((precision, mode, UNMERGED))
            if (precision, MERGED) not in REFUSED:
                engine.set_mode(MERGED)
                timed((precision, mode, MERGED))
                engine.set_mode(UNMERGED)
    engine.detach()
    return out


def run_speed(args: Any, device: Any) -> str:
    """The whole ``--speed`` run on ``device``: rehearse (fake CUDA) for the prediction, build the full-size bf16
    transformer, measure every variant at 544p; returns the table."""
    import torch

    from h3app.adapters.normalise import load_adapter
    from h3app.hardware.header_adapter import lightx2v_header
    from h3app.hardware.planner import measure
    from h3app.hardware.rehearsal import RehearsalOptions
    from h3app.lora.engine import LoRAEngine
    from h3app.rules.h3_modules import FULL_SIZE_CONFIG, transformer_shapes
    from h3app.settings import LoRASettings

    from .adapter_files import cached_adapter_file, default_cache_dir, lightx2v_layout
    from .gpu_common import RANK, RESOLUTIONS, build_full_size, time_cuda
    from .models import full_size_batch

    shapes = transformer_shapes(FULL_SIZE_CONFIG)
    plan = measure(RehearsalOptions(resolution="544p", adapter=lightx2v_header(shapes, rank=RANK, alpha=8.0)))
    predicted = predicted_steps(plan, torch.cuda.get_device_properties(device).name)
    path, _ = cached_adapter_file(args.cache_dir or default_cache_dir(), "lightx2v-full",
                                  lightx2v_layout(FULL_SIZE_CONFIG, RANK, torch.bfloat16), {"alpha": "8"})
    model = build_full_size(device)
    engine = LoRAEngine(model)
    adapter = load_adapter(path, shapes=shapes)
    height, width = RESOLUTIONS["544p"]
    seq, batch = full_size_batch(height, width, args.frames, args.text_rows, device)

    def step() -> Any:
        with torch.no_grad():
            return model(**batch)

    from h3app.hardware.planner import Placement
    from h3app.hardware.roofline import peaks_for_device, skipped_step_seconds, step_seconds

    from .gpu_decode_cache import cache_rows
    from .gpu_decode_cache import table as cache_table

    peaks = peaks_for_device(torch.cuda.get_device_properties(device).name)
    base = step_seconds(plan, Placement("none"), peaks, None) if peaks is not None else None
    cached = cache_rows(model, step, lambda op: time_cuda(op, args.repeats),
                        {"step_s": base, "skipped_step_s": skipped_step_seconds(base, plan) if base else None})
    measured = measure_steps(model, engine, lambda: engine.attach(adapter, LoRASettings(source=str(path), alpha=8.0),
                                                                  "bench"),
                             step, lambda op: time_cuda(op, args.repeats), device)
    return f"{table(speed_rows(predicted, measured))}\n\nStep cache (bf16, eager, no LoRA):\n\n{cache_table(cached)}"
