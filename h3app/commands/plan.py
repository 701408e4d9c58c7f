"""``python -m h3app plan``: will this request fit that GPU? The memory plan from a full-size rehearsal on fake CUDA.

No weights are read or downloaded: ``--model full`` is the published MiniMax-H3 sizes kept in the project,
``--adapter`` is read from its header only. docs/hardware.md explains the numbers.
"""

from __future__ import annotations

import argparse

from ..errors import H3AppError
from ..rules.choices import OFFLOAD_MODES, T2VA, WORKFLOWS
from ..rules.frames import RELEASED
from .model_options import add_adapter_flags, add_fp8_flags, add_lora_mode_flag

RESOLUTION_NAMES = ("544p", "768p")
MAX_RANKS = 64


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..hardware.flavors import BY_NAME

    p = sub.add_parser("plan", help="predict GPU and host memory for a request and the hardware it fits")
    p.add_argument("--model", default="full", help="full (the published MiniMax-H3 sizes, no weights) or tiny")
    p.add_argument("--workflow", default=T2VA, choices=WORKFLOWS)
    p.add_argument("--resolution", default="544p", choices=RESOLUTION_NAMES)
    p.add_argument("--duration", type=float, default=RELEASED.shortest_seconds,
                   help=f"seconds of video, {RELEASED.describe()}")
    p.add_argument("--dtype", default="bfloat16", help="bfloat16 (GPU default) or float32")
    p.add_argument("--offload", default="none", choices=OFFLOAD_MODES)
    add_fp8_flags(p)
    p.add_argument("--fuse-qkv", action="store_true", help="fuse q/k/v at load time")
    add_adapter_flags(p, required=False)
    p.add_argument("--alpha", default=None, help="alpha (number or auto)")
    p.add_argument("--scale", default="1.0", help="LoRA strength")
    add_lora_mode_flag(p, mode_alias=False)
    p.add_argument("--hardware", default=None, metavar="FLAVOR", help=f"judge only this flavor ({', '.join(BY_NAME)})")
    p.add_argument("--ulysses", type=int, default=1, help="context-parallel ranks (Ulysses): activations split N ways")
    p.add_argument("--ring", type=int, default=1, help="context-parallel ranks (ring attention)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..hardware.planner import make_plan
    from ..hardware.summary import describe_plan
    from .output import emit

    options, placement = plan_options(args)
    plan = make_plan(options, placement, model=args.model, hardware=args.hardware)
    emit(plan.to_json(), args.json, describe_plan(plan))
    return 0


def plan_options(args: argparse.Namespace):
    """The rehearsal options and placement of ``args``; ``H3AppError`` (one line) for anything invalid."""
    from ..hardware.planner import Placement
    from ..hardware.rehearsal import RehearsalOptions
    from ..model.loader import parse_dtype
    from ..rules.frames import RELEASED
    from ..rules.values import parse_alpha, parse_strength

    if args.model not in ("full", "tiny"):
        raise H3AppError(f"plan --model {args.model!r}: use full (the published MiniMax-H3 sizes, no weights) or "
                         f"tiny; a downloaded copy of MiniMaxAI/MiniMax-H3 has the full sizes.")
    RELEASED.check_duration(args.duration, "--duration")
    for flag in ("ulysses", "ring"):
        if not 1 <= getattr(args, flag) <= MAX_RANKS:
            raise H3AppError(f"--{flag} must be between 1 and {MAX_RANKS}, got {getattr(args, flag)}.")
    if args.fp8 and args.lora_mode == "merged" and args.adapter is not None:
        raise H3AppError("fp8 storage keeps LoRA exact only unmerged (a merge would round into fp8): "
                         "use --lora-mode unmerged, or drop --fp8.")
    if args.hardware is not None:
        from ..hardware.flavors import flavor

        flavor(args.hardware)
    adapter = None
    if args.adapter is not None:
        from ..adapters.source import read_header

        adapter = read_header(args.adapter, args.weight_name, args.revision)
    options = RehearsalOptions(workflow=args.workflow, resolution=args.resolution, duration=args.duration,
                               dtype=parse_dtype(args.dtype), fuse_qkv=args.fuse_qkv, adapter=adapter,
                               alpha=parse_alpha(args.alpha), scale=parse_strength(args.scale),
                               lora_mode=args.lora_mode)
    return options, Placement(offload=args.offload, fp8=args.fp8, ranks=args.ulysses * args.ring, ring=args.ring,
                              fp8_text_encoder=args.fp8_text_encoder)
