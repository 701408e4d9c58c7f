"""Plan before downloading: the app asks whether the real model fits the GPU it sees before fetching ~124 GB.

Runs only for a real model on a CUDA device (``tiny`` and CPU runs skip it). The plan is the full-size rehearsal at
the model's default canvas (768p, 5 s) with the app's dtype and offload. When it does not fit, the app stops with
one line naming placements that would; ``H3APP_SKIP_PLAN=1`` skips the check (at your own risk).
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import H3AppError
from ..model import repo
from ..rules.units import format_bytes
from .flavors import detected
from .planner import PREFERENCE, RESERVE, Placement, Plan, compose, fits, make_plan, measure
from .rehearsal import RehearsalOptions
from .summary import gpu, remember


def check_before_download(model: str, options: Any, device: tuple[str, int] | None | bool = True) -> Plan | None:
    """Plan ``model`` with ``options`` (``LoadOptions``) for the detected GPU; ``H3AppError`` when it cannot fit."""
    if model == repo.TINY or not str(options.device).startswith("cuda") or os.environ.get("H3APP_SKIP_PLAN") == "1":
        return None
    found = gpu() if device is True else device
    if found is None:
        raise H3AppError(f"--device {options.device} but no CUDA GPU is visible: use --device cpu, or check the driver.")
    card = detected(*found)
    rehearsal = RehearsalOptions(resolution="768p", dtype=options.dtype, fuse_qkv=options.fuse_qkv)
    placement = Placement(offload=options.offload, fp8=bool(getattr(options, "fp8", False)),
                          fp8_text_encoder=bool(getattr(options, "fp8_text_encoder", False)))
    measured = measure(rehearsal)
    plan = make_plan(rehearsal, placement, measured=measured)
    remember(model, options, plan)
    if fits(plan.peak_gpu_bytes, card, placement):
        return plan
    working = [p.label for p in PREFERENCE if fits(compose(measured, p, None)[0], card, p)]
    advice = f"use {' or '.join(working)}" if working else "no placement fits this GPU; see `python -m h3app plan`"
    raise H3AppError(f"{model} with {placement.label} needs {format_bytes(plan.peak_gpu_bytes)} at 768p on "
                     f"{found[0]} ({format_bytes(found[1])}, less a {format_bytes(RESERVE)} reserve): {advice}; nothing was downloaded.")
