"""P2 — attach an adapter file to a medium model: read + normalise + bind, until the next forward would use it.

Model and adapter: ``bench.models.medium_case`` (diffusers' H3 transformer at hidden 1024, 8 blocks + 2 refiner
blocks, 8 heads × 128, ffn 2816, fp32; a LightX2V-layout rank-128 file on the six attention/FFN targets of all 10
blocks, fp32, ≈ 96 MB, alpha 8 in ``__metadata__``).

Ours: ``load_adapter`` + ``LoRAEngine.attach`` (engine created once beforehand, as the app holds one per model). The
strength profile is not part of attach: it is measured on the first request for it (``LoRAEngine.report``) and
memoised per adapter. Peers: the read limit — ``load_file`` plus one pass that reads every tensor — and diffusers'
``lora_state_dict`` + ``load_lora_adapter`` (PEFT injection) on the same model.
"""

from __future__ import annotations

from .context import BenchContext
from .models import MEDIUM_CONFIG, medium_case
from .p1_inspect import read_every_tensor
from .peers import diffusers_attach, diffusers_detach, peft_available, quiet_diffusers
from .table import Goal, Row
from .timing import Variant, compare

CASE = "P2"
ADAPTER = "bench"
READ_GOAL = Goal("≤ 3×", max_ratio=3.0)
PEER_GOAL = Goal("≤ 0.4×", max_ratio=0.4)


def run(ctx: BenchContext) -> list[Row]:
    from safetensors.torch import load_file

    from h3app.adapters.normalise import load_adapter
    from h3app.lora.engine import LoRAEngine
    from h3app.rules.h3_modules import transformer_shapes
    from h3app.settings import LoRASettings

    case = medium_case(ctx.cache_dir)
    path, transformer = case.adapter_path, case.transformer
    size_mb = path.stat().st_size / 1e6
    ctx.log(f"P2: medium model, adapter {path.name} ({size_mb:.0f} MB) …")
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
    if matched != case.targets:
        raise RuntimeError(f"P2: {matched} targets bound, expected {case.targets}")

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
    rows = [Row(CASE, what, ours, "load_file + read every tensor", timings["read"].median, READ_GOAL,
                f"rank {case.rank}, {case.targets} targets, {size_mb:.0f} MB fp32; the read limit", clock)]
    if "diffusers" in timings:
        rows.append(Row(CASE, what, ours, "diffusers lora_state_dict + load_lora_adapter", timings["diffusers"].median,
                        PEER_GOAL, "same file, same model; PEFT injection", clock))
    else:
        rows.append(Row(CASE, what, ours, "diffusers + PEFT (not installed)", None, PEER_GOAL,
                        "pip install -r requirements-dev.txt for the peer", clock))
    return rows
