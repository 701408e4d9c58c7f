"""P5 — merged mode: the re-apply after an alpha change, against the bare merge GEMMs.

Model and adapter as in P2 (medium model, rank 128 on the six attention/FFN targets of 10 blocks, fp32). Ours:
``LoRAEngine.set_lora`` in merged mode, which re-merges every bound layer from its pristine copy
(``W = W0 + scale·B@A``, fp32, row chunks). Peer: the arithmetic alone — one ``torch.addmm(W0, B, A, alpha=scale,
out=W)`` per target on separate copies of the same tensors — the least any merge can do.
"""

from __future__ import annotations

from .adapter_files import cached_adapter_file, lightx2v_layout
from .context import BenchContext
from .models import MEDIUM_CONFIG, build_transformer
from .table import Goal, Row
from .timing import Alternate, Variant, compare

CASE = "P5"
RANK = 128
ADAPTER = "bench"


def run(ctx: BenchContext) -> list[Row]:
    import torch

    from h3app.adapters.normalise import load_adapter
    from h3app.lora.engine import LoRAEngine
    from h3app.rules.h3_modules import transformer_shapes
    from h3app.settings import LoRASettings

    specs = lightx2v_layout(MEDIUM_CONFIG, RANK, torch.float32)
    path, _ = cached_adapter_file(ctx.cache_dir, "lightx2v-medium", specs, {"alpha": "8"})
    transformer = build_transformer(MEDIUM_CONFIG)
    adapter = load_adapter(path, shapes=transformer_shapes(MEDIUM_CONFIG))
    # The bare merge's own copies (W0, W, A, B), taken before anything is merged.
    bare = []
    for target, module in adapter.modules.items():
        weight = transformer.get_submodule(target).weight.detach()
        bare.append((weight.clone(), torch.empty_like(weight), module.down.float(), module.up.float(), module.rank))
    engine = LoRAEngine(transformer)
    engine.attach(adapter, LoRASettings(source=str(path), mode="merged"), ADAPTER)

    ours_alpha = Alternate(8.0, 16.0)
    bare_alpha = Alternate(8.0, 16.0)

    def bare_merge() -> None:
        alpha = bare_alpha()
        for pristine, weight, down, up, rank in bare:
            torch.addmm(pristine, up, down, alpha=alpha / rank, out=weight)

    timings = compare([Variant("ours", lambda: engine.set_lora(ADAPTER, alpha=ours_alpha())),
                       Variant("bare", bare_merge)], repeats=ctx.repeats, warmup=1,
                      clock=ctx.clock("cpu"))
    # Both sides now hold the same alpha (each flipped the same number of times): the merges must agree.
    first = next(iter(adapter.modules))
    merged = transformer.get_submodule(first).weight
    if not torch.allclose(merged, bare[0][1], rtol=1e-5, atol=1e-6):
        raise RuntimeError(f"P5: merged weight of {first} differs from the bare merge")
    engine.detach(ADAPTER)
    params = sum(w.numel() for w, *_ in bare)
    return [Row(CASE, "merged re-apply after an alpha change, medium model", timings["ours"].median,
                "bare merge GEMMs (addmm per target)", timings["bare"].median, Goal("≤ 1.5×", max_ratio=1.5),
                f"{len(bare)} targets, {params / 1e6:.0f} M weights re-merged from the pristine copy",
                ctx.clock("cpu"))]
