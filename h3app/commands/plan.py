"""``python -m h3app plan``: will this request fit that GPU, how fast, and for how much? The judge's verdicts from a
full-size rehearsal on fake CUDA.

No weights are read or downloaded: ``--model full`` is the published MiniMax-H3 sizes kept in the project,
``--adapter`` is read from its header only. The request flags are generate's (``add_request_flags``), checked the
same way before anything heavy is imported. docs/hardware.md explains the numbers.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..errors import H3AppError
from ..rules.choices import MERGED, OFFLOAD_MODES, vae_dtype_for
from ..rules.request_defaults import FULL, TINY, defaults_for
from .flag_values import dtype_name
from .model_options import (
    RequestFlags,
    add_adapter_flags,
    add_attention_flag,
    add_cache_flag,
    add_fp8_flags,
    add_lora_mode_flag,
    add_request_flags,
    add_vae_dtype_flag,
    request_flags,
)

if TYPE_CHECKING:  # heavy imports stay inside functions
    from ..hardware.judge import PlannedRequest, Setup
    from ..hardware.planner import Placement

MAX_RANKS = 64


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..hardware.flavors import BY_NAME

    p = sub.add_parser("plan", help="predict GPU and host memory, time and $ per video, and the hardware it fits")
    p.add_argument("--model", default=FULL, help="full (the published MiniMax-H3 sizes, no weights) or tiny")
    add_request_flags(p)
    p.add_argument("--device", default="cuda", help="cuda (what every plan is for; taken so that a plan's options "
                                                    "can be given back to it unchanged)")
    p.add_argument("--dtype", default="bfloat16", type=dtype_name, help="bfloat16 (GPU default) or float32")
    p.add_argument("--offload", default="none", choices=OFFLOAD_MODES)
    add_fp8_flags(p)
    p.add_argument("--fuse-qkv", action="store_true", help="fuse q/k/v at load time")
    add_vae_dtype_flag(p)
    add_attention_flag(p)  # the backend the plan prices (auto: each card's own pick, its package assumed installed)
    add_cache_flag(p)
    add_adapter_flags(p, required=False)
    p.add_argument("--alpha", default=None, help="alpha (number or auto)")
    p.add_argument("--scale", default="1.0", help="LoRA strength")
    add_lora_mode_flag(p, mode_alias=False)
    p.add_argument("--hardware", default=None, metavar="FLAVOR", help=f"judge only this flavor ({', '.join(BY_NAME)})")
    p.add_argument("--ulysses", type=int, default=1, help="context-parallel ranks (Ulysses): activations split N ways")
    p.add_argument("--ring", type=int, default=1, help="context-parallel ranks (ring attention)")
    p.add_argument("--no-limits", action="store_true",
                   help="skip the search for the recommendation's longest clip (one rehearsal per length tried)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run, check=check_plan_values)


def run(args: argparse.Namespace) -> int:
    request, placement, setup = plan_options(args)  # every value refused here loads no torch
    from ..hardware.recommend import make_plan
    from ..hardware.summary import describe_plan
    from .output import emit

    plan = make_plan(request, placement, setup, hardware=args.hardware, with_limits=not args.no_limits)
    data, text = plan.to_json(), describe_plan(plan)
    zero = _zero_gpu_quota(plan, request, setup, args.hardware)
    if zero is not None:  # plan --hardware zero-gpu-*: the quota a video uses (docs/hardware.md, ZeroGPU)
        from ..hardware.zero_gpu_home import quota_words

        data["zerogpu"], text = zero, "\n".join([text, *quota_words(zero)])
    emit(data, args.json, text)
    return 0


def _zero_gpu_quota(plan: Any, request: PlannedRequest, setup: Setup, hardware: str | None) -> dict[str, Any] | None:
    """``hardware.zero_gpu_home.quota`` for the ZeroGPU size the app asks for (``zero-gpu-xlarge``), at its best
    placement (None: another flavor, or none fits)."""
    from ..hardware.flavors import flavor
    from ..hardware.judge import PLACEMENT_FIELDS
    from ..hardware.planner import Placement
    from ..hardware.zero_gpu_home import FLAVOR, quota

    best = next((row["best"] for row in plan.flavors if row["name"] == hardware), None)
    if hardware is None or flavor(hardware).name != FLAVOR or best is None:
        return None
    box = flavor(hardware)
    return quota(request, Placement(**{name: best[name] for name in PLACEMENT_FIELDS}), setup, box)


def check_plan_values(args: argparse.Namespace) -> RequestFlags:
    """The checked request flags (``RequestFlags``); one line for anything invalid, before torch is imported."""
    if args.model not in (FULL, TINY):
        raise H3AppError(f"plan --model {args.model!r}: use full (the published MiniMax-H3 sizes, no weights) or "
                         f"tiny; a downloaded copy of MiniMaxAI/MiniMax-H3 has the full sizes.")
    flags = request_flags(args, args.model)
    if not str(args.device).startswith("cuda"):
        raise H3AppError(f"plan judges GPU boxes: --device {args.device} is not one (use cuda, or leave it out).")
    for flag in ("ulysses", "ring"):
        if not 1 <= getattr(args, flag) <= MAX_RANKS:
            raise H3AppError(f"--{flag} must be between 1 and {MAX_RANKS}, got {getattr(args, flag)}.")
    if args.fp8 and args.lora_mode == MERGED and args.adapter is not None:
        raise H3AppError("fp8 storage keeps LoRA exact only unmerged (a merge would round into fp8): "
                         "use --lora-mode unmerged, or drop --fp8.")
    if args.hardware is not None:
        from ..hardware.flavors import flavor

        flavor(args.hardware)
    return flags


def plan_options(args: argparse.Namespace) -> tuple[PlannedRequest, Placement, Setup]:
    """``(PlannedRequest, Placement, Setup)`` of ``args``; ``H3AppError`` (one line) for anything invalid."""
    from ..rules.values import parse_alpha, parse_strength

    flags = check_plan_values(args)
    alpha, scale = parse_alpha(args.alpha), parse_strength(args.scale)
    adapter = None
    if args.adapter is not None:
        from ..adapters.source import read_header

        adapter = read_header(args.adapter, args.weight_name, args.revision)
    from ..hardware.judge import PlannedRequest, Setup
    from ..hardware.planner import Placement
    from ..model.loader import parse_dtype
    from ..rules.frames import RELEASED

    defaults = defaults_for(args.model)
    height, width = flags.canvas or defaults.planned_canvas
    request = PlannedRequest(flags.workflow or defaults.workflow, height, width, RELEASED.frames(flags.duration),
                             flags.steps or defaults.steps, args.cache)
    setup = Setup(model=args.model, dtype=parse_dtype(args.dtype), fuse_qkv=args.fuse_qkv, adapter=adapter,
                  alpha=alpha, scale=scale, lora_mode=args.lora_mode,
                  vae_dtype=parse_dtype(vae_dtype_for(args.vae_dtype, args.device)),
                  attention=args.attention)
    placement = Placement(offload=args.offload, fp8=args.fp8, ranks=args.ulysses * args.ring, ring=args.ring,
                          fp8_text_encoder=args.fp8_text_encoder)
    return request, placement, setup
