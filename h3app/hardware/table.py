"""The docs/hardware.md table, from the planner itself: ``python -m h3app.hardware.table [--adapter-rank 128]``.

One full-size rehearsal (t2va, 544p, 5 s, bf16, a 312-target LightX2V-shaped adapter unmerged), composed for every
placement the runtime offers (``planner.PREFERENCE``), judged against every flavor; prints Markdown.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..rules.h3_modules import FULL_SIZE_CONFIG, transformer_shapes
from .flavors import GB
from .header_adapter import lightx2v_header
from .planner import PREFERENCE, make_plan, measure
from .rehearsal import RehearsalOptions


def plans(rank: int = 128) -> list[Any]:
    """The plan of each placement for the default request with a ``rank`` adapter (one rehearsal for all)."""
    options = RehearsalOptions(adapter=lightx2v_header(transformer_shapes(FULL_SIZE_CONFIG), rank=rank, alpha=8.0))
    measured = measure(options)
    return [make_plan(options, placement, measured=measured) for placement in PREFERENCE]


def markdown(rows: list[Any]) -> str:
    """``| placement | peak GPU | host RAM | fits (GPU and host) |`` and the recommendation under it."""
    lines = ["| placement | peak GPU | host RAM | fits (GPU and host; multi-GPU variants of a fitting card omitted) |",
             "|---|---|---|---|"]
    for plan in rows:
        fitting = [r["name"] for r in plan.flavors if r["fits"] and r["gpus"] == 1]
        lines.append(f"| `{plan.placement.label}` | {plan.peak_gpu_bytes / GB:.1f} GB | {plan.host_bytes / GB:.1f} GB "
                     f"| {', '.join(f'`{n}`' for n in fitting) or 'none'} |")
    r = rows[0].recommended
    if r:
        lines.append("")
        lines.append(f"Recommended: `{r['hardware']}` (${r['usd_per_hour']:.2f}/h) with `{r['options']}`: GPU peak "
                     f"{r['peak_gpu_bytes'] / GB:.1f} of {r['gpu_bytes'] / GB:.0f} GB, host {r['host_bytes'] / GB:.1f} "
                     f"of {r['host_ram_bytes'] / GB:.0f} GB.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter-rank", type=int, default=128)
    rows = plans(parser.parse_args().adapter_rank)
    measured = rows[0]
    print(markdown(rows))
    print()
    print("components:", {k: round(v / GB, 1) for k, v in measured.components.items()})
    print("phases:", {k: round(v["transient"] / GB, 2) for k, v in measured.phases.items()})
    print("tokens:", measured.tokens)


if __name__ == "__main__":
    main()
