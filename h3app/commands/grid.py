"""``python -m h3app grid``: one adapter over an alpha × scale (× seed) grid — an mp4 per cell, each with its
distance to the no-LoRA output of the same seed (the baseline runs once per seed)."""

from __future__ import annotations

import argparse

from ..rules.frames import RELEASED
from .flag_values import duration_seconds, seed_list
from .model_options import add_lora_mode_flag, add_run_flags, compile_fields, load_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("grid", help="an adapter over an alpha × scale grid: one mp4 per cell, distance to no LoRA")
    add_run_flags(p)
    p.add_argument("--alphas", default="auto", help='comma-separated alphas; "auto" = the file\'s alpha chain')
    p.add_argument("--scales", default="0.5,1", help="comma-separated scales (strength multipliers)")
    p.add_argument("--seeds", default="0", type=seed_list, help="comma-separated seeds")
    p.add_argument("--prompt", required=True)
    p.add_argument("--steps", type=int, default=5, help="num_inference_steps (N steps = N-1 evaluations)")
    p.add_argument("--duration", type=duration_seconds, default=RELEASED.shortest_seconds,
                   help=f"seconds, {RELEASED.describe()}")
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--width", type=int, default=None)
    add_lora_mode_flag(p)
    p.add_argument("--out-dir", required=True, help="folder for the cells' mp4 files")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import os
    import shutil
    from pathlib import Path

    from ..backend.generation import GenerationRequest
    from ..backend.grid import parse_values
    from ..backend.service import Backend
    from ..parallel.follower import bind, follow
    from ..parallel.launch import close_ranks, start_ranks
    from ..settings import LoRASettings
    from .output import emit

    alphas = parse_values(args.alphas, "--alphas", allow_auto=True)
    strengths = parse_values(args.scales, "--scales")
    seeds = args.seeds
    request = GenerationRequest(prompt=args.prompt, seed=seeds[0], steps=args.steps, duration=args.duration,
                                height=args.height, width=args.width)
    adapter = LoRASettings(source=args.adapter, weight_name=args.weight_name, revision=args.revision,
                           mode=args.lora_mode)
    out = Path(args.out_dir)
    group = start_ranks(args)  # --ulysses/--ring: None for one rank (docs/multi-gpu.md)
    backend = Backend(args.model, load_options(args))
    bind(group, backend)
    cells = []
    try:
        if group is not None and not group.leader:
            return follow(group, backend)
        plan = backend.plan_grid(alphas, strengths, seeds)
        out.mkdir(parents=True, exist_ok=True)
        for cell in backend.grid(request, adapter, plan, os.environ.get("HF_TOKEN")):
            alpha = "auto" if cell.alpha is None else f"{cell.alpha:g}"
            video = out / f"alpha{alpha}-scale{cell.strength:g}-seed{cell.seed}.mp4"
            shutil.move(cell.video_path, video)
            Path(cell.thumbnail_path).unlink(missing_ok=True)
            cells.append({**cell.to_json(), "video_path": str(video), "thumbnail_path": None})
    finally:
        backend.close()
        close_ranks(group)
    result = {"adapter": args.adapter, "prompt": args.prompt, "steps": request.steps, "out_dir": str(out),
              "parallel": group.spec.label if group is not None else "one rank", "cells": cells, **compile_fields(args)}
    lines = [f"alpha {c['alpha'] if c['alpha'] is not None else 'auto'} × scale {c['strength']:g}, seed {c['seed']}: "
             f"{c['video_path']} (PSNR to no LoRA {c['baseline_psnr']} dB)" for c in cells]
    emit(result, args.json, "\n".join([f"{len(cells)} cells in {out}", *lines]))
    return 0
