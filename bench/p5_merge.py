"""P5 — merged mode: the re-apply after an alpha change, against the bare merge GEMMs, for each place the pristine
copies can live.

Model and adapter: ``bench.models.medium_case`` (as P2: rank 128 on the six attention/FFN targets of 10 blocks,
fp32). Ours: ``LoRAEngine.set_lora`` in merged mode, which re-merges every bound layer from its pristine copy
(``W = W0 + scale·B@A``, fp32, row chunks), once with the copies on the weights' device (``device``: on a CPU model a
second copy in RAM; on a GPU a device-side add) and once in host RAM (``ram``: on a GPU pinned, streamed in chunks
overlapped with the adds). Peer: the arithmetic alone — one ``torch.addmm(W0, B, A, alpha=scale, out=W)`` per target
on separate copies of the same tensors — the least any merge can do.

``time_placements`` is the piece ``bench/gpu.py`` shares: it switches an engine through the placements and times
the re-apply with the caller's timer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from h3app.rules.choices import MERGED, UNMERGED

from .context import BenchContext
from .models import MEDIUM_CONFIG, medium_case
from .table import Goal, Row
from .timing import Alternate, Variant, compare

CASE = "P5"
ADAPTER = "bench"
PLACEMENTS = ("device", "ram")
GOAL = Goal("≤ 1.5×", max_ratio=1.5)


def time_placements(engine: Any, name: str, timer: Callable[[Callable[[], None]], Any],
                    placements: Sequence[str] = PLACEMENTS, device_budget: int | None = None) -> dict[str, Any]:
    """For each placement: back to unmerged, ``engine.pristine.set_placement(placement, device_budget)``, switch to
    merged (the copies are made there, the weights merged), then ``timer(change)`` where ``change`` flips adapter
    ``name``'s alpha between 8 and 16 (a full re-merge each call). Returns placement → what ``timer`` returned, or
    the ``H3AppError`` text when that placement was refused. Leaves the engine unmerged at alpha 8."""
    from h3app.errors import H3AppError

    results: dict[str, Any] = {}
    for placement in placements:
        engine.set_mode(UNMERGED)
        engine.set_lora(name, alpha=8.0)
        engine.pristine.set_placement(placement, device_budget)
        try:
            engine.set_mode(MERGED)
        except H3AppError as error:
            results[placement] = str(error)
            continue
        alpha = Alternate(8.0, 16.0)
        results[placement] = timer(lambda alpha=alpha: engine.set_lora(name, alpha=alpha()))
    engine.set_mode(UNMERGED)
    engine.set_lora(name, alpha=8.0)
    engine.pristine.set_placement("auto")
    return results


def run(ctx: BenchContext) -> list[Row]:
    import torch

    from h3app.adapters.normalise import load_adapter
    from h3app.lora.engine import LoRAEngine
    from h3app.rules.h3_modules import transformer_shapes
    from h3app.settings import LoRASettings

    case = medium_case(ctx.cache_dir)
    transformer = case.transformer
    adapter = load_adapter(case.adapter_path, shapes=transformer_shapes(MEDIUM_CONFIG))
    # The bare merge's own copies (W0, W, A, B), taken before anything is merged.
    bare = []
    for target, module in adapter.modules.items():
        weight = transformer.get_submodule(target).weight.detach()
        bare.append((weight.clone(), torch.empty_like(weight), module.down.float(), module.up.float(), module.rank))
    engine = LoRAEngine(transformer)
    engine.attach(adapter, LoRASettings(source=str(case.adapter_path), alpha=8.0), ADAPTER)
    first = next(iter(adapter.modules))
    clock = ctx.clock("cpu")

    def timer(change: Callable[[], None]) -> tuple[float, float]:
        bare_alpha = Alternate(8.0, 16.0)

        def bare_merge() -> None:
            alpha = bare_alpha()
            for pristine, weight, down, up, rank in bare:
                torch.addmm(pristine, up, down, alpha=alpha / rank, out=weight)

        timings = compare([Variant("ours", change), Variant("bare", bare_merge)], repeats=ctx.repeats, warmup=1,
                          clock=clock)
        # Both sides flipped the same number of times from alpha 8: the merges must agree.
        if not torch.allclose(transformer.get_submodule(first).weight, bare[0][1], rtol=1e-5, atol=1e-6):
            raise RuntimeError(f"P5: merged weight of {first} differs from the bare merge")
        return timings["ours"].median, timings["bare"].median

    results = time_placements(engine, ADAPTER, timer)
    engine.detach(ADAPTER)
    params = sum(w.numel() for w, *_ in bare)
    rows = []
    for placement, result in results.items():
        what = f"merged re-apply after an alpha change, pristine on {placement}, medium model"
        if isinstance(result, str):
            rows.append(Row(CASE, what, float("nan"), "bare merge GEMMs (addmm per target)", None, GOAL,
                            f"refused: {result}", clock))
            continue
        ours, peer = result
        rows.append(Row(CASE, what, ours, "bare merge GEMMs (addmm per target)", peer, GOAL,
                        f"{len(bare)} targets, {params / 1e6:.0f} M weights re-merged from the pristine copy", clock))
    return rows
