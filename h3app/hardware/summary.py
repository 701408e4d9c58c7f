"""One line about the hardware for the UI header and the CLI: GPU, planned peak, headroom.

``hardware_line(model, options)`` never rehearses (the header renders at once): it reads the GPU, and the peak from
the last plan made in this process for the same model and options (``remember``), which the app records when it
plans before loading. Without a plan it says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..rules.units import format_bytes

if TYPE_CHECKING:
    from .planner import Plan

_PLANS: dict[tuple[str, str, str, bool, bool], Plan] = {}


def gpu() -> tuple[str, int] | None:
    """(name, total bytes) of CUDA device 0, or None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    properties = torch.cuda.get_device_properties(0)
    return properties.name, int(properties.total_memory)


def _key(model: str, options: Any) -> tuple[str, str, str, bool, bool]:
    return (str(model), str(getattr(options, "dtype", "")), str(getattr(options, "offload", "none")),
            bool(getattr(options, "fp8", False)), bool(getattr(options, "fp8_text_encoder", False)))


def remember(model: str, options: Any, plan: Plan) -> None:
    """Keep ``plan`` as the plan of ``model`` loaded with ``options`` (a ``LoadOptions``)."""
    _PLANS[_key(model, options)] = plan


def hardware_line(model: str, options: Any, device: tuple[str, int] | None | bool = True) -> str:
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
    lines = [f"{plan.model} {plan.workflow} {plan.resolution} {plan.duration:g}s, {plan.dtype}, "
             f"{plan.placement.label}" + (f", LoRA {plan.lora_mode} ({plan.targets_bound} targets)"
                                          if plan.lora_mode else "")]
    lines.append(f"peak GPU {format_bytes(plan.peak_gpu_bytes)}; host RAM {format_bytes(plan.host_bytes)}; "
                 f"tokens {plan.tokens.get('total', 0):,}")
    for name, size in plan.components.items():
        lines.append(f"  {name}: {format_bytes(size)}")
    for name, phase in plan.phases.items():
        lines.append(f"  phase {name}: peak {format_bytes(phase['peak'])} "
                     f"(resident {format_bytes(phase['resident'])} + transient {format_bytes(phase['transient'])})")
    fitting = [name for name, ok in plan.fits.items() if ok]
    lines.append("fits (GPU and host): " + (", ".join(fitting) if fitting else "none of the flavors"))
    if len(plan.flavors) == 1:
        row = plan.flavors[0]
        lines.append(f"{row['name']}: " + margins(plan.peak_gpu_bytes, plan.host_bytes, row["gpu_bytes"],
                                                   row["host_bytes"]))
    if plan.recommended:
        r = plan.recommended
        price = f"${r['usd_per_hour']:.2f}/h, " if r["usd_per_hour"] is not None else ""
        lines.append(f"recommended: {r['hardware']} ({price}cheapest that fits) with {r['options']}: "
                     + margins(r["peak_gpu_bytes"], r["host_bytes"], r["gpu_bytes"], r["host_ram_bytes"]))
    else:
        lines.append("recommended: no flavor fits both GPU and host")
    lines.extend(f"warning: {w}" for w in plan.warnings)
    lines.extend(describe_predictions(plan))
    return "\n".join(lines)


def describe_predictions(plan: Plan) -> list[str]:
    """The roofline lines of ``plan``: FLOPs per evaluation, then per flavor step, video, check, cost, LoRA
    overhead (predicted from spec-sheet peaks, docs/hardware.md)."""
    if not plan.predicted:
        return []
    lines = [f"predicted (spec-sheet roofline, not measured): {plan.flops_per_evaluation / 1e12:,.1f} TFLOP "
             f"per evaluation"]
    for name, p in plan.predicted.items():
        check = f", check {p['check_s']:,.0f} s" if p.get("check_s") is not None else ""
        cost = f", ${p['usd_per_video']:.3f}/video" if p.get("usd_per_video") is not None else ""
        lora = f", LoRA ×{p['lora_overhead']:.3f}" if plan.lora_mode and p.get("lora_overhead") else ""
        fits = "" if plan.fits.get(name) else " (does not fit)"
        lines.append(f"  {name}{fits}: step {p['step_s']:.2f} s, video {p['video_s']:,.0f} s{check}{cost}{lora}")
    return lines
