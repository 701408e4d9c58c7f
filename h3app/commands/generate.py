"""``python -m h3app generate``: prompt → mp4 with stereo audio (contract in DESIGN.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .model_options import add_model_flags, load_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate a video with stereo audio")
    add_model_flags(p)
    p.add_argument("--workflow", default="t2va", choices=("t2va",), help="t2va (text to video+audio)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=5,
                   help="num_inference_steps: sigma points including the terminal one, so N steps = N-1 evaluations")
    p.add_argument("--duration", type=float, default=5.0, help="seconds, 5 to 15 (frames follow H3's 17n+5 rule)")
    p.add_argument("--height", type=int, default=None, help="pixels; multiple of the model's canvas multiple")
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--shift", type=float, default=None, help="video flow shift (default: the scheduler's, 12)")
    p.add_argument("--audio-shift", type=float, default=None, help="audio flow shift (default: the scheduler's, 3)")
    p.add_argument("--out", required=True, help="output .mp4 path")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..backend.generation import GenerationRequest, run_generation, save_result
    from ..cli import emit
    from ..errors import H3AppError
    from ..model.loader import load_model

    if not args.out.endswith(".mp4"):
        raise H3AppError(f"--out must end in .mp4, got {args.out!r}.")
    request = GenerationRequest(prompt=args.prompt, seed=args.seed, steps=args.steps, duration=args.duration,
                                height=args.height, width=args.width, shift=args.shift,
                                audio_shift=args.audio_shift, workflow=args.workflow)
    model = load_model(args.model, args.workflow, load_options(args))
    result = run_generation(model.pipeline(args.workflow), request)
    settings = {
        "model": model.name,
        "model_commit": model.location.commit,
        "request": request.to_json(),
        "adapters": [],
        "hash": result.hash,
    }
    out = save_result(result, Path(args.out), settings)
    summary = {
        "out": str(out),
        "seed": request.seed,
        "steps": request.steps,
        "evaluations": result.evaluations,
        "frames": result.frames,
        "fps": 24,
        "width": result.width,
        "height": result.height,
        "sample_rate": result.sample_rate,
        "audio_channels": int(result.audio.shape[0]),
        "hash": result.hash,
        "adapters": [],
        "seconds": round(result.seconds, 3),
    }
    emit(summary, args.json, f"wrote {out}: {result.frames} frames {result.width}x{result.height} @24fps, "
                             f"stereo {result.sample_rate} Hz, {result.evaluations} evaluations, {result.hash}")
    return 0
