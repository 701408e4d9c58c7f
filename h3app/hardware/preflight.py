"""Plan before downloading: the app asks whether the real model fits the box it runs on before fetching ~124 GB.

Runs only for a real model on a CUDA device (``tiny`` and CPU runs skip it). It is the judge's verdict
(``judge.judge``) on the app's default request (``rules.request_defaults``: 1344×768, 124 frames, the full model's
steps) with the app's dtype, offload, fp8 flags and context-parallel ranks, against the box it sees: its GPUs
(the smallest, when they differ) and its physical RAM. When that cannot fit, the app stops with one line naming
placements that would; ``H3APP_SKIP_PLAN=1`` skips the check (at your own risk).
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import H3AppError
from ..model import repo
from ..rules.units import format_bytes
from .flavors import Flavor
from .judge import (
    DEFAULT_SETUP,
    PlannedRequest,
    Setup,
    Verdict,
    default_request,
    fitting,
    judge,
    limits,
    nothing_fits,
)
from .planner import RESERVE, Placement
from .summary import remember

SKIP_PLAN_ENV = "H3APP_SKIP_PLAN"


def host_ram() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def this_box(devices: list[tuple[str, int]] | None = None, host: int | None | bool = True) -> Flavor | None:
    """The box this process runs on as a flavor — ``devices`` (``(name, bytes)`` per GPU; None: this machine's)
    and ``host`` RAM (True: this machine's) — or None without a CUDA GPU."""
    if devices is None:
        from ..model.loader import cuda_devices

        devices = cuda_devices()
    if not devices:
        return None
    name, smallest = min(devices, key=lambda device: device[1])
    return Flavor("detected", name, len(devices), int(smallest), host_ram() if host is True else host, None, None,
                  None)


def setup_of(options: Any) -> Setup:
    """The judge's setup for ``options`` (a ``LoadOptions``): the published sizes in its dtype, its video decoder's
    dtype for its device (``loader.decoder_dtype``), no adapter, its ``--attention`` value."""
    from ..model.loader import decoder_dtype

    return Setup(dtype=options.dtype, fuse_qkv=bool(getattr(options, "fuse_qkv", False)),
                 vae_dtype=decoder_dtype(options) if hasattr(options, "vae_dtype") else DEFAULT_SETUP.vae_dtype,
                 attention=getattr(options, "attention", DEFAULT_SETUP.attention))


def placement_of(options: Any, ranks: int = 1, ring: int = 1) -> Placement:
    return Placement(offload=options.offload, fp8=bool(getattr(options, "fp8", False)), ranks=ranks, ring=ring,
                     fp8_text_encoder=bool(getattr(options, "fp8_text_encoder", False)))


def check_before_download(model: str, options: Any, device: tuple[str, int] | None | bool = True,
                          host: int | None | bool = True, *, ranks: int = 1, ring: int = 1,
                          request: PlannedRequest | None = None) -> Verdict | None:
    """Judge ``model`` with ``options`` (``LoadOptions``) and ``ranks`` on this box at ``request`` (default: the
    app's); ``H3AppError`` when it cannot fit. ``device``/``host``: True reads this machine; a value (or None: none
    or unknown) stands in for it (tests; ``device`` is one GPU, repeated ``ranks`` times)."""
    if model == repo.TINY or not str(options.device).startswith("cuda") or os.environ.get(SKIP_PLAN_ENV) == "1":
        return None
    devices = None if device is True else ([device] * max(1, ranks) if device else [])
    box = this_box(devices, host)
    if box is None:
        raise H3AppError(f"--device {options.device} but no CUDA GPU is visible: use --device cpu, or check the driver.")
    request = request or default_request()
    setup, placement = setup_of(options), placement_of(options, ranks, ring)
    verdict = judge(request, placement, box, setup)
    remember(model, options, verdict)
    if verdict.fits:
        return verdict
    canvas = f"{request.width}×{request.height}, {request.frames} frames"
    if not verdict.fits_gpu:
        need = (f"needs {format_bytes(verdict.peak_gpu_bytes)} at {canvas} on {box.gpu} ({format_bytes(box.gpu_bytes)}"
                f", less a {format_bytes(RESERVE)} reserve)")
    else:
        need = (f"needs {format_bytes(verdict.host_bytes)} of host RAM at {canvas}; this machine has "
                f"{format_bytes(box.host_bytes)}")
    working = [v.placement.label for v in fitting(request, box, setup)]
    advice = f"use {' or '.join(working[:3])}" if working else nothing_fits(request, box, setup)
    raise H3AppError(f"{model} with {placement.label} {need}: {advice}; nothing was downloaded.")


def held_limits(verdict: Verdict | None, options: Any) -> dict[str, Any] | None:
    """The longest clip and largest canvas ``verdict``'s placement holds on its box (``judge.limits``): the limits
    the app gives its UI and API. None for a run that was not judged (tiny, the CPU, ``H3APP_SKIP_PLAN``)."""
    if verdict is None:
        return None
    return limits(verdict.request, verdict.placement, verdict.box, setup_of(options))
