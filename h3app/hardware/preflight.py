"""Plan before downloading: the app asks whether the real model fits the GPU it sees before fetching ~124 GB.

Runs only for a real model on a CUDA device (``tiny`` and CPU runs skip it). The plan is the full-size rehearsal at
the model's default canvas (768p, 5 s) with the app's dtype and offload. When it does not fit, the app stops with
one line naming placements that would; ``H3APP_SKIP_PLAN=1`` skips the check (at your own risk). The box's host
RAM (its physical memory) is judged beside the GPU, as the plan judges a flavor's.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import H3AppError
from ..model import repo
from ..rules.units import format_bytes
from .flavors import detected
from .planner import PREFERENCE, RESERVE, Placement, Plan, compose, host_bytes, judge, make_plan, measure
from .rehearsal import RehearsalOptions
from .summary import gpu, remember


def host_ram() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def check_before_download(model: str, options: Any, device: tuple[str, int] | None | bool = True,
                          host: int | None | bool = True) -> Plan | None:
    """Plan ``model`` with ``options`` (``LoadOptions``) for the detected GPU and host RAM; ``H3AppError`` when it
    cannot fit. ``device``/``host``: True reads this machine; a value (or None: unknown) stands in for it (tests)."""
    if model == repo.TINY or not str(options.device).startswith("cuda") or os.environ.get("H3APP_SKIP_PLAN") == "1":
        return None
    found = gpu() if device is True else device
    if found is None:
        raise H3AppError(f"--device {options.device} but no CUDA GPU is visible: use --device cpu, or check the driver.")
    card = detected(*found, host_bytes=host_ram() if host is True else host)
    rehearsal = RehearsalOptions(resolution="768p", dtype=options.dtype, fuse_qkv=options.fuse_qkv)
    placement = Placement(offload=options.offload, fp8=bool(getattr(options, "fp8", False)),
                          fp8_text_encoder=bool(getattr(options, "fp8_text_encoder", False)))
    measured = measure(rehearsal)
    plan = make_plan(rehearsal, placement, measured=measured)
    remember(model, options, plan)
    verdict = judge(plan.peak_gpu_bytes, plan.host_bytes, card, placement)
    if verdict["fits"]:
        return plan
    working = [p.label for p in PREFERENCE
               if judge(compose(measured, p, None)[0], host_bytes(measured, p, None), card, p)["fits"]]
    advice = f"use {' or '.join(working)}" if working else "no placement fits this box; see `python -m h3app plan`"
    need = (f"needs {format_bytes(plan.peak_gpu_bytes)} at 768p on {found[0]} ({format_bytes(found[1])}, less a "
            f"{format_bytes(RESERVE)} reserve)")
    if verdict["fits_gpu"]:
        need = f"needs {format_bytes(plan.host_bytes)} of host RAM at 768p; this machine has {format_bytes(card.host_bytes)}"
    raise H3AppError(f"{model} with {placement.label} {need}: {advice}; nothing was downloaded.")
