"""``python -m h3app grid``: one adapter over an alpha × scale (× seed) grid, or several adapters (``--adapters``; a
folder or repo with a glob ``--weight-name``: one training run's checkpoints in order) as rows × scale — an mp4 per
cell, each with its distance to the no-LoRA output of the same seed (the baseline runs once per seed)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from ..rules.request_defaults import FULL_DEFAULTS, TINY_DEFAULTS, defaults_for
from .flag_values import seed_list
from .generate import add_preview_flags, not_applied_text, preview_board, preview_line
from .model_options import (
    add_cache_flag,
    add_lora_mode_flag,
    add_request_flags,
    add_run_flags,
    check_strengths,
    compile_fields,
    load_options,
    parse_adapter_spec,
    request_flags,
    strength_fields,
)

if TYPE_CHECKING:
    from ..settings import LoRASettings


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("grid", help="adapters (or one run's checkpoints) × alpha × scale: one mp4 per cell, "
                                    "distance to no LoRA")
    add_run_flags(p, adapter_required=False)
    p.add_argument("--adapters", nargs="+", default=None, metavar="SOURCE",
                   help='one row per adapter, each as --adapter takes it (or "SOURCE,weight=F,rev=R"); with '
                        '--weight-name "*.safetensors" a folder or repo gives one row per file, in training order')
    full, tiny = FULL_DEFAULTS.grid, TINY_DEFAULTS.grid
    p.add_argument("--alphas", default=None, help=f'comma-separated alphas; "auto" = the file\'s alpha chain '
                                                  f'(default "{full.alphas}" full, "{tiny.alphas}" tiny)')
    p.add_argument("--scales", default=None, help=f'comma-separated scales (strength multipliers; default '
                                                  f'"{full.scales}" full, "{tiny.scales}" tiny)')
    p.add_argument("--seeds", default=None, type=seed_list, help=f'comma-separated seeds (default "{full.seeds}")')
    p.add_argument("--prompt", required=True)
    add_request_flags(p, workflow=False)  # --steps --duration|--frames --height --width, as generate and plan
    add_lora_mode_flag(p)
    add_cache_flag(p)
    p.add_argument("--out-dir", required=True, help="folder for the cells' mp4 files")
    add_preview_flags(p, "DIR/<cell>/step-K.png, <cell> named as its mp4 (baselines: baseline-seedS)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run, check=check_values)  # refused before torch loads


def check_values(args: argparse.Namespace) -> None:
    """The checks across flags (one line each): the request's values for ``--model``, the adapter's strengths."""
    from ..errors import H3AppError

    request_flags(args, args.model)
    if (args.adapter is None) == (args.adapters is None):
        raise H3AppError("grid takes --adapter SOURCE (alpha × scale) or --adapters A B … (a row per adapter), "
                         "one of the two.")
    if args.adapters is not None:
        adapter_rows(args)  # each row's advanced strengths are checked with it
    else:
        check_strengths(args, mode=args.lora_mode)


def adapter_rows(args: argparse.Namespace) -> list[LoRASettings]:
    """``--adapters`` as settings: each item parsed as ``--adapter-spec`` (source first; ``weight=``, ``rev=``);
    ``--weight-name``/``--revision`` apply to the items that name none; strengths are the grid's columns."""
    from ..errors import H3AppError
    from ..rules import values

    rows = []
    for item in args.adapters:
        settings = parse_adapter_spec(item, args.lora_mode)
        if settings.strength != 1.0 or settings.alpha is not None:
            raise H3AppError(f"--adapters {values.short(item)}: give strengths with --scales and alphas with "
                             "--alphas (they are the grid's columns and rows).")
        rows.append(dataclasses.replace(
            settings, weight_name=settings.weight_name or args.weight_name,
            revision=settings.revision or args.revision, skip_parts=tuple(args.skip_parts),
            any_partition=args.any_partition, **strength_fields(args)))
    return rows


def run(args: argparse.Namespace) -> int:
    import os
    import shutil
    from pathlib import Path

    from ..backend.grid import as_rows, cell_name, parse_values, row_name
    from ..backend.service import Backend
    from ..hardware.zero_gpu_home import command_time_model
    from ..parallel.follower import bind, follow
    from ..parallel.launch import close_ranks, start_ranks
    from ..request import GenerationRequest
    from ..settings import LoRASettings
    from .output import emit

    defaults = defaults_for(args.model)
    flags = request_flags(args, args.model)
    default_alphas = defaults.grid.alphas if args.adapters is None else "auto"  # rows of adapters: their own alpha
    alphas = parse_values(args.alphas or default_alphas, "--alphas", allow_auto=True)
    strengths = parse_values(args.scales or defaults.grid.scales, "--scales")
    seeds = args.seeds or seed_list(defaults.grid.seeds)
    request = GenerationRequest(prompt=args.prompt, seed=seeds[0], steps=flags.steps or defaults.steps,
                                duration=flags.duration, height=flags.height, width=flags.width, cache=args.cache)
    given = adapter_rows(args) if args.adapters is not None else [
        LoRASettings(source=args.adapter, weight_name=args.weight_name, revision=args.revision, mode=args.lora_mode,
                     skip_parts=tuple(args.skip_parts), any_partition=args.any_partition, **strength_fields(args))]
    out = Path(args.out_dir)
    previews = preview_board(args)
    group = start_ranks(args)  # --ulysses/--ring: None for one rank (docs/multi-gpu.md)
    backend = Backend(args.model, load_options(args))
    backend.time_model = command_time_model(args.model, load_options(args))  # ZeroGPU: calls' durations
    bind(group, backend)
    cells = []
    try:
        if group is not None and not group.leader:
            return follow(group, backend)
        # one --adapter: the grid over its alphas, as ever; --adapters: a row each (a glob expanded into files)
        rows = backend.grid_rows(given, os.environ.get("HF_TOKEN")) if args.adapters is not None else as_rows(given[0])
        plan = backend.plan_grid(alphas, strengths, seeds, len(rows))
        out.mkdir(parents=True, exist_ok=True)
        names = [row_name(i, row) if len(rows) > 1 else "" for i, row in enumerate(rows)]
        target = rows if args.adapters is not None else given[0]
        for cell in backend.grid(request, target, plan, os.environ.get("HF_TOKEN"), previews=previews):
            video = out / f"{cell_name(cell.alpha, cell.strength, cell.seed, names[cell.adapter_row])}.mp4"
            shutil.move(cell.video_path, video)
            Path(cell.thumbnail_path).unlink(missing_ok=True)
            cells.append({**cell.to_json(), "video_path": str(video), "thumbnail_path": None})
    finally:
        backend.close()
        close_ranks(group)
    from ..adapters.summary import not_applied_lines

    firsts = {c["adapter_row"]: c["adapter"] or {} for c in reversed(cells)}  # a row's file: the same in its cells
    left_out = not_applied_lines([firsts[row] for row in sorted(firsts)])
    result = {"adapter": args.adapter, "rows": [row.to_json() for row in rows], "prompt": args.prompt, "steps": request.steps, "out_dir": str(out),
              "parallel": group.spec.label if group is not None else "one rank", "cells": cells,
              "not_applied": left_out, **compile_fields(args)}
    if previews is not None:
        result["previews"] = previews.summary()
    zerogpu = next((c["zerogpu"] for c in cells if c.get("zerogpu")), None)  # a grid split into ZeroGPU calls
    if zerogpu is not None:
        result["zerogpu"] = zerogpu
    lines = [f"{c['label'] + ': ' if len(rows) > 1 else ''}"
             f"alpha {c['alpha'] if c['alpha'] is not None else 'auto'} × scale {c['strength']:g}, seed {c['seed']}: "
             f"{c['video_path']} (PSNR to no LoRA {c['baseline_psnr']} dB)" for c in cells]
    calls = (f"\nZeroGPU: over one call's {zerogpu['cap_s']} s cap, so run as {zerogpu['calls']} calls (quota "
             f"asked: {zerogpu['quota_s']} s)") if zerogpu is not None else ""
    emit(result, args.json, "\n".join([f"{len(cells)} cells in {out}", *lines]) + not_applied_text(left_out)
         + preview_line(result.get("previews")) + calls)
    return 0
