"""P2 — attach an adapter file to a medium model: read + normalise + bind, until the next forward would use it.

Model: diffusers' H3 transformer at hidden 1024, 8 blocks + 2 refiner blocks, 8 heads × 128, ffn 2816 (fp32).
Adapter: LightX2V layout, rank 128 on the six attention/FFN targets of all 10 blocks, fp32 (≈ 96 MB), alpha 8 in
``__metadata__``.

Ours: ``load_adapter`` + ``LoRAEngine.attach`` (engine created once beforehand, as the app holds one per model).
Peers: the read limit — ``load_file`` plus one pass that reads every tensor — and diffusers' ``lora_state_dict`` +
``load_lora_adapter`` (PEFT injection) on the same model.
"""

from __future__ import annotations

from .adapter_files import cached_adapter_file, lightx2v_layout
from .context import BenchContext
from .models import MEDIUM_CONFIG, build_transformer
from .p1_inspect import read_every_tensor
from .peers import diffusers_attach, diffusers_detach, peft_available, quiet_diffusers
from .table import Goal, Row
from .timing import Variant, compare

CASE = "P2"
RANK = 128
ADAPTER = "bench"


def run(ctx: BenchContext) -> list[Row]:
    import torch
    from safetensors.torch import load_file

    from h3app.adapters.normalise import load_adapter
    from h3app.lora.engine import LoRAEngine
    from h3app.rules.h3_modules import transformer_shapes
    from h3app.settings import LoRASettings

    specs = lightx2v_layout(MEDIUM_CONFIG, RANK, torch.float32)
    path, _ = cached_adapter_file(ctx.cache_dir, "lightx2v-medium", specs, {"alpha": "8"})
    size_mb = path.stat().st_size / 1e6
    ctx.log(f"P2: medium model, adapter {path.name} ({size_mb:.0f} MB) …")
    transformer = build_transformer(MEDIUM_CONFIG)
    shapes = transformer_shapes(MEDIUM_CONFIG)
    engine = LoRAEngine(transformer)
    settings = LoRASettings(source=str(path))

    def detach_ours() -> None:
        if ADAPTER in engine.active():
            engine.detach(ADAPTER)

    def attach_ours() -> None:
        engine.attach(load_adapter(path, shapes=shapes), settings, ADAPTER)

    attach_ours()
    matched = len(engine.report(ADAPTER).matched)
    detach_ours()
    if matched != len(specs) // 2:
        raise RuntimeError(f"P2: {matched} targets bound, expected {len(specs) // 2}")

    def detach_all() -> None:
        detach_ours()
        diffusers_detach(transformer)

    variants = [Variant("ours", attach_ours, setup=detach_all, teardown=detach_all),
                Variant("read", lambda: read_every_tensor(load_file(path)))]
    if peft_available():
        quiet_diffusers()
        variants.append(Variant("diffusers", lambda: diffusers_attach(transformer, path), setup=detach_all,
                                teardown=detach_all))
    clock = ctx.clock("cpu")
    timings = compare(variants, repeats=ctx.repeats, warmup=1, clock=clock)
    ours = timings["ours"].median
    what = "attach (read + normalise + bind), medium model"
    rows = [Row(CASE, what, ours, "load_file + read every tensor", timings["read"].median, Goal("≤ 2×", max_ratio=2.0),
                f"rank {RANK}, {len(specs) // 2} targets, {size_mb:.0f} MB fp32; the read limit", clock)]
    if "diffusers" in timings:
        rows.append(Row(CASE, what, ours, "diffusers lora_state_dict + load_lora_adapter", timings["diffusers"].median,
                        Goal("≤ 0.5×", max_ratio=0.5), "same file, same model; PEFT injection", clock))
    else:
        rows.append(Row(CASE, what, ours, "diffusers + PEFT (not installed)", None, Goal("≤ 0.5×", max_ratio=0.5),
                        "pip install -r requirements-dev.txt for the peer", clock))
    return rows
