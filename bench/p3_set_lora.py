"""P3 — an alpha/strength change made visible to the next forward, unmerged, at the real depth (52 blocks).

Model: diffusers' H3 transformer with 50 blocks + 2 refiner blocks at a small width (hidden 256, 2 heads × 128,
ffn 512); adapter: LightX2V layout, rank 32, on all 312 attention/FFN targets. Depth is what matters here: the cost
of a change must not grow with the number of layers (docs/architecture.md, decision 4).

Ours: ``LoRAEngine.set_lora`` (it refills the adapter's few shared scale entries) plus whatever the layers would
then pay on the next forward before their arithmetic (``LoRAFactors.scale_values``: a read of the shared entry; a
design that refreshed per layer would show here) — together, everything a change costs. It is measured as
(set_lora + one scale lookup per layer) minus the same lookups without a change (which every forward pays anyway),
each the mean of many back-to-back calls. Peer: diffusers ``set_adapters`` (PEFT ``set_weights_and_activate_adapters``: a
``set_scale`` on every LoRA layer). Also: the same at 4 blocks (growth with depth) and each followed by a real
forward (end to end).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .adapter_files import cached_adapter_file, lightx2v_layout
from .context import BenchContext
from .models import (
    DEEP_NARROW_CONFIG,
    build_transformer,
    packed_input_for_tokens,
    with_depth,
)
from .peers import (
    diffusers_attach,
    diffusers_detach,
    peft_available,
    peft_set_weight,
    quiet_diffusers,
)
from .table import Goal, Row
from .timing import Alternate, Variant, compare

CASE = "P3"
RANK = 32
ADAPTER = "bench"
SHALLOW_LAYERS = 2  # + 2 refiner blocks = 4 blocks
FORWARD_TOKENS = 32


def _bound(ctx: BenchContext, config: dict[str, Any]) -> tuple[Any, Any, Any, list[Any]]:
    """(engine, transformer, adapter path, bound entries) for ``config`` with our engine attached."""
    import torch

    from h3app.adapters.normalise import load_adapter
    from h3app.lora.engine import LoRAEngine
    from h3app.lora.layers import LoRALinear
    from h3app.rules.h3_modules import transformer_shapes
    from h3app.settings import LoRASettings

    specs = lightx2v_layout(config, RANK, torch.float32)
    blocks = config["num_layers"] + config["num_refiner_layers"]
    path, _ = cached_adapter_file(ctx.cache_dir, f"lightx2v-narrow{blocks}", specs, {"alpha": "8"})
    transformer = build_transformer(config)
    engine = LoRAEngine(transformer)
    engine.attach(load_adapter(path, shapes=transformer_shapes(config)), LoRASettings(source=str(path)), ADAPTER)
    entries = [entry for module in transformer.modules() if isinstance(module, LoRALinear)
               for entry in module.lora_entries]
    if len(entries) != len(specs) // 2:
        raise RuntimeError(f"P3: {len(entries)} bound layers, expected {len(specs) // 2}")
    return engine, transformer, path, entries


def _change(engine: Any, entries: list[Any]) -> Callable[[], None]:
    """An alpha change plus what the next forward does first: each layer's scale lookup (a lazy refresh, after a
    change)."""
    alpha = Alternate(8.0, 16.0)

    def change() -> None:
        engine.set_lora(ADAPTER, alpha=alpha())
        for entry in entries:
            entry.scale_values()

    return change


def _lookups(entries: list[Any]) -> Callable[[], None]:
    """The same per-layer scale lookups with no change before them: what every forward pays anyway."""

    def lookups() -> None:
        for entry in entries:
            entry.scale_values()

    return lookups


def run(ctx: BenchContext) -> list[Row]:
    import torch

    inner = 50  # microsecond operations: many calls per timed run keep the subtraction below out of the noise
    engine, transformer, path, entries = _bound(ctx, DEEP_NARROW_CONFIG)
    shallow_config = with_depth(DEEP_NARROW_CONFIG, SHALLOW_LAYERS)
    shallow_engine, _, _, shallow_entries = _bound(ctx, shallow_config)
    blocks = DEEP_NARROW_CONFIG["num_layers"] + DEEP_NARROW_CONFIG["num_refiner_layers"]
    shallow_blocks = SHALLOW_LAYERS + DEEP_NARROW_CONFIG["num_refiner_layers"]
    set_alpha = Alternate(8.0, 16.0)
    variants = [Variant("ours", _change(engine, entries), inner=inner),
                Variant("lookups", _lookups(entries), inner=inner),
                Variant("set_lora", lambda: engine.set_lora(ADAPTER, alpha=set_alpha()), inner=inner),
                Variant("shallow", _change(shallow_engine, shallow_entries), inner=inner),
                Variant("shallow_lookups", _lookups(shallow_entries), inner=inner)]

    inputs = packed_input_for_tokens(DEEP_NARROW_CONFIG, FORWARD_TOKENS)
    strength = Alternate(1.0, 0.5)

    def ours_change_and_forward() -> None:
        engine.set_lora(ADAPTER, strength=strength())
        transformer(**inputs)

    e2e = [Variant("ours", ours_change_and_forward)]
    peer_transformer = None
    if peft_available():
        quiet_diffusers()
        peer_transformer = build_transformer(DEEP_NARROW_CONFIG)  # a second copy: both stay bound, runs interleave
        diffusers_attach(peer_transformer, path)
        weight = Alternate(1.0, 0.5)
        variants.append(Variant("peft", lambda: peft_set_weight(peer_transformer, weight()),
                                inner=max(1, inner // 10)))

        def peer_change_and_forward() -> None:
            peft_set_weight(peer_transformer, weight())
            peer_transformer(**inputs)

        e2e.append(Variant("peft", peer_change_and_forward))

    clock = ctx.clock("cpu")
    changes = compare(variants, repeats=ctx.repeats, warmup=2, clock=clock)
    with torch.no_grad():
        forwards = compare(e2e, repeats=ctx.heavy_repeats + 1, warmup=2, clock=clock)
    engine.detach(ADAPTER)
    shallow_engine.detach(ADAPTER)

    # What the change costs: set_lora + the refresh it triggers, without the lookups every forward does anyway.
    ours = max(changes["ours"].median - changes["lookups"].median, changes["set_lora"].median)
    # Growth with depth compares two differences of microsecond timings: from the best (least disturbed) round of
    # each, since a difference of medians moved 1.0–2.0× between runs of the same code on two shared cores.
    # A change cannot cost less than set_lora itself (O(1), the same at any depth); timer noise can say otherwise.
    deep_best = max(changes["ours"].best - changes["lookups"].best, changes["set_lora"].best)
    shallow_best = max(changes["shallow"].best - changes["shallow_lookups"].best, changes["set_lora"].best)
    peer = changes["peft"].median if "peft" in changes else None
    what = f"alpha change → next forward sees it, unmerged, {blocks} blocks ({len(entries)} LoRA layers)"
    rows = [
        Row(CASE, what, ours, "PEFT set_adapters" if peer is not None else "PEFT (not installed)", peer,
            Goal("≤ 0.1 ms and ≤ 1/100", max_ratio=0.01, max_seconds=1e-4),
            f"ours = set_lora + the per-layer scale refresh it triggers on the next forward (measured as (set_lora + "
            f"one scale lookup per layer) − the same lookups without a change: {changes['ours'].median * 1e6:.1f} − "
            f"{changes['lookups'].median * 1e6:.1f} µs); set_lora alone {changes['set_lora'].median * 1e6:.1f} µs", clock),
        Row(CASE, f"same, {blocks} vs {shallow_blocks} blocks (growth with depth)", deep_best,
            f"ours at {shallow_blocks} blocks ({len(shallow_entries)} layers)", shallow_best,
            Goal("≤ 1.5× (O(1) in layers)", max_ratio=1.5),
            "the cost of a change must not grow with the number of layers; each term from its best round", clock,
            statistic=f"best of {len(changes['ours'].runs)}"),
    ]
    if peer_transformer is not None:
        diffusers_detach(peer_transformer)
        rows.append(Row(CASE, f"change + one forward ({FORWARD_TOKENS} tokens), {blocks} blocks", forwards["ours"].median,
                        "PEFT set_adapters + forward", forwards["peft"].median, Goal("≤ 1×", max_ratio=1.0),
                        "end to end at a small width, where per-layer Python overhead is visible", clock))
    return rows
