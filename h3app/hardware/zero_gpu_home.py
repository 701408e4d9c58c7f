"""ZeroGPU as a home: the card each call is granted, the start-up line, and the quota a video uses.

``app.py`` asks :func:`home_for` when ``backend.zero_gpu.mode()`` is set: on a ZeroGPU Space the judge sees the
``zero-gpu-xlarge`` flavor (the whole RTX Pro 6000 each ``@spaces.GPU(size="xlarge")`` call gets; outside a call
CUDA is emulated, so the device this process sees says nothing), the time model predicts on that card, and
``--compile`` and several ranks are refused in one line. ``plan --hardware zero-gpu-xlarge`` adds :func:`quota`:
seconds per default video and per Turbo 4-step video, the duration each call declares and the quota it asks for,
and how many a free and a PRO visitor make a day. The README's ZeroGPU numbers are these (a test holds them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..backend import zero_gpu
from ..errors import H3AppError
from .flavors import Flavor, flavor
from .judge import PlannedRequest, Setup, judge
from .planner import Placement

FLAVOR = f"zero-gpu-{zero_gpu.SIZE}"
TURBO_TITLE = "LightX2V H3 Turbo 4-step v1.x (768p)"  # the registry's Turbo preset at the default canvas
COMPILE_REFUSED = ("--compile does not run on ZeroGPU: each GPU call is a freshly forked process, so torch.compile's "
                   "graphs would be compiled again inside every call, on the visitor's quota (and ZeroGPU does not "
                   "support it); start without --compile (docs/hardware.md, ZeroGPU).")


@dataclass(frozen=True)
class Home:
    """Where the app runs under ZeroGPU: ``box`` (a flavor, or True: this machine, for the stand-in), the start-up
    ``line``, and ``judged``: the device and host the start-up check is given instead of this machine's."""

    mode: str
    box: Flavor | bool
    line: str
    judged: dict[str, Any]

    def time_model(self, model: str, options: Any) -> Any:
        """The time model on the granted card (``hardware.estimate.TimeModel``, as ``for_app`` builds it)."""
        from ..model import repo
        from .estimate import TimeModel
        from .preflight import placement_of, setup_of

        setup = setup_of(options)
        setup = Setup(model=repo.TINY if model == repo.TINY else setup.model, dtype=setup.dtype,
                      vae_dtype=setup.vae_dtype, fuse_qkv=setup.fuse_qkv, attention=setup.attention)
        assert isinstance(self.box, Flavor)
        return TimeModel(setup.model, setup, placement_of(options), self.box)


FORK_ON_CUDA = (f"the ZeroGPU stand-in ({zero_gpu.FORK_ENV}=1) forks this process for every GPU job, and CUDA cannot "
                "run in a forked child: use --device cpu (on ZeroGPU itself, spaces keeps CUDA out of the parent).")


def home_for(mode: str, *, compile: bool, ranks: int, device: str | None = None) -> Home:
    """The home for ``mode`` (``zero_gpu.SPACES`` or ``zero_gpu.FORK``); ``H3AppError`` for what cannot run there
    (``device``: the stand-in runs on the CPU only)."""
    if compile:
        raise H3AppError(COMPILE_REFUSED)
    if mode == zero_gpu.FORK and str(device or "").startswith("cuda"):
        raise H3AppError(FORK_ON_CUDA)
    if ranks > 1:
        raise H3AppError("ZeroGPU grants one card per call: drop --ulysses/--ring (H3APP_ULYSSES/H3APP_RING).")
    cap, margin = zero_gpu.cap_s(), f"+ {zero_gpu.MARGIN:.0%} + {zero_gpu.START_S} s"
    if mode == zero_gpu.SPACES:
        box = flavor(FLAVOR)
        return Home(mode, box, (
            f"ZeroGPU (SPACES_ZERO_GPU is set): every GPU job is one @spaces.GPU(size=\"{zero_gpu.SIZE}\") call on "
            f"the whole {box.gpu} ({box.gpu_bytes / 1e9:.0f} GB), placed for that card; each call declares the time "
            f"model's prediction {margin} and asks for at most {cap} s of the visitor's quota"),
            {"device": (box.gpu, box.gpu_bytes), "host": None})
    return Home(mode, True, (
        f"ZeroGPU stand-in ({zero_gpu.FORK_ENV}=1): every GPU job runs in a forked child on this machine, declaring "
        f"what a ZeroGPU call would (prediction {margin}, at most {cap} s of quota); nothing here runs on ZeroGPU"), {})


def turbo_steps() -> int:
    """The registry's Turbo 4-step preset's steps (sigma points: 4 evaluations)."""
    from ..adapters.known import KNOWN_ADAPTERS

    return next(k.steps for k in KNOWN_ADAPTERS if k.title == TURBO_TITLE and k.steps is not None)


def quota(request: PlannedRequest, placement: Placement, setup: Setup, box: Flavor) -> dict[str, Any]:
    """For ``plan``: the request and its Turbo 4-step twin on ``box`` with ``placement`` — predicted seconds, the
    call's declared duration and quota, whether it fits one call, and videos per day per visitor tier."""
    out: dict[str, Any] = {"size": zero_gpu.SIZE, "cap_s": zero_gpu.cap_s(), "margin": zero_gpu.MARGIN,
                           "start_s": zero_gpu.START_S, "daily_quota_s": dict(zero_gpu.DAILY_QUOTA_S)}
    for name, steps in (("default", request.steps), ("turbo", turbo_steps())):
        verdict = judge(replace(request, steps=steps), placement, box, setup)
        video = (verdict.prediction or {}).get("video_s")
        if video is None:
            out[name] = None
            continue
        call = zero_gpu.declared(float(video))
        out[name] = {"steps": steps, "video_s": video, "duration_s": call.duration_s, "quota_s": call.quota_s,
                     "fits_one_call": call.quota_s <= call.cap_s,
                     "per_day": {tier: zero_gpu.videos_per_day(float(video), call, tier)
                                 for tier in zero_gpu.DAILY_QUOTA_S}}
    return out


def quota_words(numbers: dict[str, Any]) -> list[str]:
    """``plan``'s lines for :func:`quota`."""
    lines = [f"ZeroGPU ({numbers['size']}, each call: prediction + {numbers['margin']:.0%} + {numbers['start_s']} s, "
             f"at most {numbers['cap_s']} s of quota; daily quota free {numbers['daily_quota_s']['free']} s, PRO "
             f"{numbers['daily_quota_s']['pro']} s):"]
    for name in ("default", "turbo"):
        row = numbers[name]
        if row is None:
            lines.append(f"  {name}: no prediction for this card")
            continue
        fits = "fits one call" if row["fits_one_call"] else "over the per-call cap: refused"
        lines.append(f"  {name} ({row['steps']} steps): video {row['video_s']:.0f} s, declares {row['duration_s']} s = "
                     f"{row['quota_s']} s of quota ({fits}); per day: free {row['per_day']['free']}, PRO "
                     f"{row['per_day']['pro']}")
    return lines


def command_time_model(model: str, options: Any) -> Any:
    """Under ZeroGPU or its stand-in, the time model a command's Backend sizes its calls with (``--compile``
    refused in one line); None elsewhere (the command runs as it always has)."""
    mode = zero_gpu.mode()
    if mode is None:
        return None
    home = home_for(mode, compile=bool(getattr(options, "compile", False)), ranks=1,
                    device=str(getattr(options, "device", "")))
    if home.box is True:
        from .estimate import for_app

        return for_app(model, options)
    return zero_gpu.outside_emulation_of(home.time_model(model, options))


def quota_table(numbers: dict[str, Any], canvas: str) -> str:
    """README's table of :func:`quota` (``canvas``: the request in words)."""
    lines = [f"| video ({canvas}) | predicted | declares | quota asked | one call? | per day: free | per day: PRO |",
             "|---|---|---|---|---|---|---|"]
    for name, label in (("default", "default, {steps} steps"), ("turbo", "Turbo 4-step ({steps} steps)")):
        row = numbers[name]
        fits = "yes" if row["fits_one_call"] else "no: over the cap"
        lines.append(f"| {label.format(steps=row['steps'])} | {row['video_s']:.0f} s | {row['duration_s']} s | "
                     f"{row['quota_s']} s | {fits} | {row['per_day']['free']} | {row['per_day']['pro']} |")
    return "\n".join(lines)
