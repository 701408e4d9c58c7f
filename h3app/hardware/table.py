"""The docs/hardware.md tables, from the plan itself: ``python -m h3app.hardware.table [--limits]``.

One full-size rehearsal of the default request (``rules.request_defaults``: t2va, 1344×768, 124 frames, the full
model's steps, bf16, no adapter), judged for every flavor (``recommend.make_plan``): per flavor the fastest
placement that fits, its GPU and host margins, seconds and dollars per video. ``--limits`` adds the longest clip
each flavor's placement holds (``judge.limits``: a rehearsal per clip length tried, minutes each on two cores).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..rules.units import format_bytes
from .flavors import BY_NAME, GB
from .judge import DEFAULT_SETUP, PLACEMENT_FIELDS, PlannedRequest, default_request, limits
from .planner import Placement
from .recommend import Plan, make_plan


def default_plan(with_limits: bool = False) -> Plan:
    """The plan of the default request (the ``plan`` command without flags)."""
    return make_plan(default_request(), Placement(), DEFAULT_SETUP, with_limits=with_limits)


def _margin(value: int | None) -> str:
    if value is None:
        return "not published"
    return format_bytes(value) if value >= 0 else f"-{format_bytes(-value)}"


def markdown(plan: Plan) -> str:
    """``| flavor | fastest placement that fits | GPU peak (margin) | host (margin) | step | video | $/video |``,
    one row per flavor, and the recommendation under it."""
    r = plan.request
    lines = [f"Request: {r['workflow']} {r['width']}×{r['height']}, {r['frames']} frames, {r['steps']} steps, "
             f"{plan.dtype}, no adapter.", "",
             "| flavor | $/h | fastest placement that fits | GPU peak (margin) | host RAM (margin) | step | video "
             "| $/video |", "|---|---|---|---|---|---|---|---|"]
    for row in plan.flavors:
        best = row["best"]
        price = f"{row['usd_per_hour']:.2f}" if row["usd_per_hour"] is not None else "—"
        if best is None:
            lines.append(f"| `{row['name']}` | {price} | nothing fits | | | | | |")
            continue
        seconds = (f"{best['step_s']:.2f} s | {best['video_s']:,.0f} s" if best["video_s"] is not None
                   else "— | —")
        dollars = f"{best['usd_per_video']:.3f}" if best["usd_per_video"] is not None else "—"
        lines.append(f"| `{row['name']}` | {price} | `{best['placement']}` | "
                     f"{best['peak_gpu_bytes'] / GB:.1f} GB ({_margin(best['gpu_margin_bytes'])}) | "
                     f"{best['host_bytes'] / GB:.1f} GB ({_margin(best['host_margin_bytes'])}) | {seconds} | {dollars} |")
    rec = plan.recommended
    if rec:
        lines += ["", f"Recommended: `{rec['hardware']}` (${rec['usd_per_video']:.3f} per video at "
                      f"${rec['usd_per_hour']:.2f}/h) with `{rec['options']}`."]
    return "\n".join(lines)


def limits_table(plan: Plan, request: PlannedRequest | None = None) -> str:
    """``| flavor | placement | longest clip |``: what each fitting flavor's fastest placement holds."""
    request = request or default_request()
    lines = ["| flavor | placement | longest clip at 1344×768 |", "|---|---|---|"]
    for row in plan.flavors:
        best = row["best"]
        if best is None:
            continue
        placement = _placement_of(best)
        held: dict[str, Any] | None = limits(request, placement, BY_NAME[row["name"]], DEFAULT_SETUP)
        clip = f"{held['max_duration_s']:g} s ({held['max_frames']} frames)" if held else "—"
        lines.append(f"| `{row['name']}` | `{best['placement']}` | {clip} |")
    return "\n".join(lines)


def _placement_of(best: dict[str, Any]) -> Placement:
    return Placement(**{name: best[name] for name in PLACEMENT_FIELDS})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", action="store_true", help="also the longest clip per flavor (slow)")
    args = parser.parse_args()
    plan = default_plan()
    print(markdown(plan))
    if args.limits:
        print()
        print(limits_table(plan))
    print()
    print("components:", {k: round(v / GB, 1) for k, v in plan.components.items()})
    print("phases:", {k: round(v["transient"] / GB, 2) for k, v in plan.phases.items()})
    print("tokens:", plan.tokens)


if __name__ == "__main__":
    main()
