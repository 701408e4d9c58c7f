"""P4 — the per-forward cost of an unmerged rank-128 adapter, against the bare model and against PEFT.

Two models: one main block at the real width (hidden 5376, 56 heads × 128, ffn 14336, the real AdaLN and
input/output projections; fp32 on CPU) and the medium model of P2. Adapter: LightX2V layout, rank 128, bf16 file,
on the six attention/FFN targets. Three module trees share one set of weight tensors
(``bench.models.shared_weight_copy``): bare, ours (``LoRAEngine``, unmerged) and PEFT (diffusers
``load_lora_adapter``); their forwards run interleaved round by round.

The theoretical ratio is FLOPs with the adapter / FLOPs without (``bench.models.linear_flops``: every Linear on the
rows it sees, attention's ``QKᵀ`` and ``AV``, plus ``2·rows·r·(in + out)`` per target). Token counts are far below a
real request (18,870 video rows at 544p) so that a forward takes seconds on 2 cores; the theory at 544p for the
full model is printed beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .adapter_files import cached_adapter_file, lightx2v_layout
from .context import BenchContext
from .models import (
    MEDIUM_CONFIG,
    build_transformer,
    full_width_block_config,
    linear_flops,
    packed_input_for_tokens,
    shared_weight_copy,
)
from .peers import diffusers_attach, peft_available, quiet_diffusers
from .table import Goal, Row
from .timing import Variant, compare

CASE = "P4"
RANK = 128
ADAPTER = "bench"


def theoretical_ratio(config: Mapping[str, Any], tokens: int, text_rows: int, rank: int = RANK) -> float:
    """(base + LoRA FLOPs) / base FLOPs for the LightX2V targets of ``config`` at ``tokens`` rows."""
    from h3app.rules.h3_modules import is_block_linear, transformer_shapes

    targets = {name: rank for name in transformer_shapes(config).linears if is_block_linear(name)}
    flops = linear_flops(config, tokens, text_rows, targets)
    return (flops["base"] + flops["lora"]) / flops["base"]


def real_request_theory() -> float:
    """The theoretical ratio for the full 52-block model on a 544p, 124-frame request (18,870 video rows)."""
    from h3app.rules.h3_modules import FULL_SIZE_CONFIG

    from .models import sequence_rows

    rows = sequence_rows(544, 960, 124)
    return theoretical_ratio(FULL_SIZE_CONFIG, rows["video"] + rows["audio"] + rows["text"], rows["text"])


def _measure_model(ctx: BenchContext, label: str, config: dict, tokens: int, repeats: int) -> dict[str, Any]:
    import torch

    from h3app.adapters.normalise import load_adapter
    from h3app.lora.engine import LoRAEngine
    from h3app.rules.h3_modules import transformer_shapes
    from h3app.settings import LoRASettings

    specs = lightx2v_layout(config, RANK, torch.bfloat16)
    path, _ = cached_adapter_file(ctx.cache_dir, f"lightx2v-{label}", specs, {"alpha": "8"})
    ctx.log(f"P4: building the {label} model …")
    base = build_transformer(config)
    ours = shared_weight_copy(base)
    LoRAEngine(ours).attach(load_adapter(path, shapes=transformer_shapes(config)), LoRASettings(source=str(path)),
                            ADAPTER)
    models = {"base": base, "ours": ours}
    if peft_available():
        quiet_diffusers()
        models["peft"] = shared_weight_copy(base)
        diffusers_attach(models["peft"], path)
    inputs = packed_input_for_tokens(config, tokens)

    def forward(model: torch.nn.Module):
        def call() -> None:
            with torch.no_grad():
                model(**inputs)
        return call

    ctx.log(f"P4: {label}: {tokens} tokens, {repeats} rounds of {len(models)} forwards …")
    timings = compare([Variant(name, forward(model)) for name, model in models.items()], repeats=repeats, warmup=1,
                      clock=ctx.clock("cpu"))
    _check_same_adapter(models, inputs, label)
    text_rows = int(inputs["text_indices"].numel())
    return {"timings": timings, "theory": theoretical_ratio(config, tokens, text_rows)}


def _check_same_adapter(models: dict, inputs: dict, label: str) -> None:
    """Ours and PEFT must compute the same thing (same adapter, same alpha), and differ from the bare model."""
    import torch

    with torch.no_grad():
        outputs = {name: model(**inputs).sample for name, model in models.items()}
    base, ours = outputs["base"], outputs["ours"]
    if torch.equal(base, ours):
        raise RuntimeError(f"P4 {label}: the adapter changed nothing")
    if "peft" in outputs:
        error = float((ours - outputs["peft"]).abs().max() / (ours - base).abs().max())
        if error > 1e-3:
            raise RuntimeError(f"P4 {label}: ours and PEFT disagree (max|Δ| / max|LoRA effect| = {error:.2g})")


def run(ctx: BenchContext) -> list[Row]:
    block_tokens = 32 if ctx.quick else 256
    medium_tokens = 64 if ctx.quick else 512
    repeats = ctx.heavy_repeats + (0 if ctx.quick else 2)
    block = _measure_model(ctx, "fullwidth-block", full_width_block_config(), block_tokens, repeats)
    medium = _measure_model(ctx, "medium", dict(MEDIUM_CONFIG), medium_tokens, repeats)
    real = real_request_theory()
    rows: list[Row] = []
    for label, result, base_goal in (
        (f"one full-width block, {block_tokens} tokens", block, Goal("≤ 1.1×", max_ratio=1.1)),
        (f"medium model, {medium_tokens} tokens", medium, Goal("— (theory beside)")),
    ):
        timings = result["timings"]
        ours = timings["ours"]
        theory = f"theory {result['theory']:.3f}×"
        if label.startswith("one full-width"):
            theory += f" here, {real:.3f}× for the full model at 544p (18,870 video rows)"
        rows.append(Row(CASE, f"unmerged forward, rank {RANK}, {label}", ours.median, "bare model forward",
                        timings["base"].median, base_goal,
                        f"{theory}; best-of-{len(ours.runs)} ratio {ours.best / timings['base'].best:.3f}×",
                        ctx.clock("cpu")))
        if "peft" in timings:
            rows.append(Row(CASE, f"unmerged forward, rank {RANK}, {label}", ours.median, "PEFT forward",
                            timings["peft"].median, Goal("≤ 1×", max_ratio=1.0),
                            f"same adapter via diffusers load_lora_adapter; best-of ratio "
                            f"{ours.best / timings['peft'].best:.3f}×", ctx.clock("cpu")))
    return rows
