"""One line about the hardware for the UI header and the CLI: GPU, planned peak, headroom.

``hardware_line(model, options)`` never rehearses (the header renders at once): it reads the GPU, and the peak from
the last plan made in this process for the same model and options (``remember``), which the app records when it
plans before loading. Without a plan it says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from ..rules.units import format_bytes

if TYPE_CHECKING:
    from .judge import Verdict
    from .recommend import Plan

_PLANS: dict[tuple[str, str, str, bool, bool], Plan | Verdict] = {}


def gpu() -> tuple[str, int] | None:
    """(name, total bytes) of CUDA device 0, or None without CUDA."""
    from ..model.loader import cuda_devices

    devices = cuda_devices()
    return devices[0] if devices else None


def _key(model: str, options: Any) -> tuple[str, str, str, bool, bool]:
    return (str(model), str(getattr(options, "dtype", "")), str(getattr(options, "offload", "none")),
            bool(getattr(options, "fp8", False)), bool(getattr(options, "fp8_text_encoder", False)))


def remember(model: str, options: Any, plan: Plan | Verdict) -> None:
    """Keep ``plan`` (a ``Plan``, or the start-up check's ``Verdict``: the header reads only its peak) as the plan of
    ``model`` loaded with ``options`` (a ``LoadOptions``)."""
    _PLANS[_key(model, options)] = plan


def hardware_line(model: str, options: Any, device: tuple[str, int] | None | Literal[True] = True) -> str:
    """``"GPU: NVIDIA H200 (141.0 GB) · planned peak 118.2 GB · headroom 22.8 GB"``, or the CPU line.

    ``device``: True reads CUDA device 0; a ``(name, bytes)`` pair or None stands in for it (tests)."""
    found = gpu() if device is True else device
    placement = getattr(options, "device", "cpu")
    if found is None or not str(placement).startswith("cuda"):
        where = "no GPU" if found is None else f"GPU {found[0]} unused"
        return f"CPU ({where}) · {model} runs on the CPU"
    name, total = found
    plan = _PLANS.get(_key(model, options))
    if plan is None:
        return f"GPU: {name} ({format_bytes(total)}) · no memory plan for {model} (`python -m h3app plan`)"
    headroom = total - plan.peak_gpu_bytes
    verdict = f"headroom {format_bytes(headroom)}" if headroom >= 0 else f"short by {format_bytes(-headroom)}"
    return f"GPU: {name} ({format_bytes(total)}) · planned peak {format_bytes(plan.peak_gpu_bytes)} · {verdict}"


def margins(peak: int, host: int, gpu_bytes: int, host_ram: int | None) -> str:
    """``"GPU 72.6 of 80.0 GB (margin 4.4 GB) · host 131.0 of 142.0 GB (margin 7.0 GB)"``: what is left after
    the planner's reserves (negative: short by that much)."""
    from .planner import HOST_RESERVE, RESERVE

    gpu = f"GPU {format_bytes(peak)} of {format_bytes(gpu_bytes)} (margin {_signed(gpu_bytes - RESERVE - peak)})"
    if host_ram is None:
        return f"{gpu} · host {format_bytes(host)} (host RAM not published)"
    return f"{gpu} · host {format_bytes(host)} of {format_bytes(host_ram)} (margin {_signed(host_ram - HOST_RESERVE - host)})"


def _signed(value: int) -> str:
    return format_bytes(value) if value >= 0 else f"-{format_bytes(-value)}"


def describe_plan(plan: Plan) -> str:
    """The human summary of ``plan`` printed by ``python -m h3app plan`` without ``--json``."""
    r = plan.request
    lines = [f"{plan.model} {r['workflow']} {r['width']}×{r['height']}, {r['frames']} frames ({plan.duration:g} s), "
             f"{r['steps']} steps, {plan.dtype} (video decoder {plan.vae_dtype}), {plan.placement.label}"
             + (f", LoRA {plan.lora_mode} ({plan.targets_bound} targets)" if plan.lora_mode else "")]
    lines.append(f"peak GPU {format_bytes(plan.peak_gpu_bytes)}; host RAM {format_bytes(plan.host_bytes)}; "
                 f"tokens {plan.tokens.get('total', 0):,}")
    for name, size in plan.components.items():
        lines.append(f"  {name}: {format_bytes(size)}")
    for name, phase in plan.phases.items():
        lines.append(f"  phase {name}: peak {format_bytes(phase['peak'])} "
                     f"(resident {format_bytes(phase['resident'])} + transient {format_bytes(phase['transient'])})")
    fitting = [name for name, ok in plan.fits.items() if ok]
    lines.append(f"{plan.placement.label} fits (GPU and host): "
                 + (", ".join(fitting) if fitting else "none of the flavors"))
    if len(plan.flavors) == 1:
        row = plan.flavors[0]
        lines.append(f"{row['name']}: " + margins(plan.peak_gpu_bytes, plan.host_bytes, row["gpu_bytes"],
                                                   row["host_bytes"]))
    lines.append("fastest placement per flavor (spec-sheet prediction, not measured):")
    for row in plan.flavors:
        lines.append(f"  {row['name']}: " + describe_best(row))
    if plan.recommended:
        lines.append(describe_recommended(plan.recommended))
    else:
        lines.append("recommended: no Space flavor fits both GPU and host")
    lines.extend(f"warning: {w}" for w in plan.warnings)
    return "\n".join(lines)


def describe_best(row: dict[str, Any]) -> str:
    """``--offload none --fp8 …: step 8.70 s, decode 3 s, video 180 s, $0.138/video, attention fa3`` (or why
    nothing)."""
    b = row.get("best")
    if b is None:
        return "nothing fits"
    if b.get("video_s") is None:
        return f"{b['placement']} (no spec-sheet peaks for {row['gpu']}: no time or price)"
    price = f", ${b['usd_per_video']:.3f}/video" if b.get("usd_per_video") is not None else ""
    attention = f", attention {b['attention']}" if b.get("attention") else ""
    return (f"{b['placement']}: step {b['step_s']:.2f} s, decode {b['decode_s']:,.1f} s, video "
            f"{b['video_s']:,.0f} s{price}{attention}")


def describe_recommended(r: dict[str, Any]) -> str:
    """The recommendation: flavor, $/video, flags, margins, limits."""
    held = r.get("limits")
    limit = (f"; holds up to {held['max_duration_s']:g} s ({held['max_frames']} frames) at "
             f"{held['width']}×{held['height']}" if held else "")
    return (f"recommended: {r['hardware']} (${r['usd_per_video']:.3f} per video, ${r['usd_per_hour']:.2f}/h, the "
            f"fewest dollars per video) with {r['options']}: "
            + margins(r["peak_gpu_bytes"], r["host_bytes"], r["gpu_bytes"], r["host_ram_bytes"]) + limit)
