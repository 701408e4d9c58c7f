"""``python -m h3app generate``: prompt (+ adapters) → mp4 with stereo audio (contract in docs/architecture.md)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..errors import H3AppError
from ..rules.choices import PREVIEW_DECODERS, T2VA
from ..rules.request_defaults import SEED, defaults_for
from .flag_values import mp4_path
from .model_options import (  # noqa: F401 - parse_adapter_spec: importable from here as before
    add_cache_flag,
    add_lora_mode_flag,
    add_request_flags,
    add_run_flags,
    compile_fields,
    load_options,
    parse_adapter_spec,
    request_flags,
    strength_fields,
)

if TYPE_CHECKING:  # heavy imports stay inside functions
    from ..backend.preview import PreviewBoard
    from ..settings import LoRASettings


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate a video with stereo audio, optionally with LoRA adapters")
    add_run_flags(p, adapter_required=False)
    add_request_flags(p)  # --workflow --steps --duration|--frames --height --width, as plan takes them
    p.add_argument("--prompt", required=True)
    p.add_argument("--seed", type=int, default=None, help=f"default {SEED}")
    p.add_argument("--shift", type=float, default=None, help="video flow shift (default: preset, else 12)")
    p.add_argument("--audio-shift", type=float, default=None, help="audio flow shift (default: preset, else 3)")
    p.add_argument("--first-frame", default=None, help="fl2va: image the video starts from")
    p.add_argument("--last-frame", default=None, help="fl2va: image the video ends on")
    p.add_argument("--reference", action="append", default=[], help="ref2va: image/video/audio file (repeatable)")
    p.add_argument("--alpha", type=float, default=None, help="override alpha (default: the file's alpha chain)")
    p.add_argument("--scale", type=float, default=1.0, help="strength multiplier (may be negative)")
    p.add_argument("--adapter-spec", action="append", default=[], metavar="SPEC",
                   help='another adapter as "SOURCE,weight=F,rev=R,alpha=A,scale=S" plus the advanced strengths '
                        'video=, text=, audio=, schedule=, blocks= (repeatable)')
    add_lora_mode_flag(p)
    add_cache_flag(p)
    p.add_argument("--out", required=True, type=mp4_path, help="output .mp4 path")
    add_preview_flags(p, "DIR/step-K.png for each evaluation K (1-based)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run, check=check_values)  # refused before torch loads


def add_preview_flags(p: argparse.ArgumentParser, where: str) -> None:
    """``--preview-dir`` (off unless given) and ``--preview-decoder`` (docs/cli.md, "Step previews")."""
    p.add_argument("--preview-dir", default=None, metavar="DIR",
                   help=f"write a preview of the clean-sample estimate after every evaluation: {where}")
    p.add_argument("--preview-decoder", default="auto", choices=PREVIEW_DECODERS,
                   help="auto: the model's own VAE when small, else fitted latent→RGB factors, else pca false colours")


def preview_board(args: argparse.Namespace) -> PreviewBoard | None:
    """The run's PreviewBoard for ``--preview-dir`` (None without it)."""
    if args.preview_dir is None:
        return None
    from ..backend.preview import PreviewBoard

    return PreviewBoard(args.preview_dir, decoder=args.preview_decoder)


def preview_line(summary: dict[str, Any] | None) -> str:
    """The human line of ``--preview-dir``'s summary ("" without it)."""
    if summary is None:
        return ""
    share = summary["share_of_step"]
    cost = f", {share:.1%} of a step each" if share is not None else ""
    return (f"\n  previews: {summary['files']} in {summary['dir']} ({summary['decoder']}{cost})"
            + "".join(f"\n  preview note: {note}" for note in summary["notes"]))


def not_applied_text(lines: list[str]) -> str:
    """The lines under a run's summary that name the keys each adapter left out ("" when none)."""
    return "".join(f"\n  {line}" for line in lines)


def recipe_lines(adapters: list[dict[str, Any]], used: dict[str, Any]) -> list[str]:
    """``["flashgen: declares steps 5 (base_schedule (file metadata)); this run used 9"]``: each declared sampling
    value (``adapters/recipe.py``) the run's steps and shifts did not follow."""
    from ..adapters.recipe import run_notes
    from ..adapters.summary import file_stem

    return [f"{file_stem(a)}: {note}" for a in adapters for note in run_notes(a.get("recipe"), used)]


def check_values(args: argparse.Namespace) -> None:
    """The checks across flags: the request's values for ``--model`` and the adapters' flags (one line each)."""
    request_flags(args, args.model)
    adapters_from_args(args)


def adapters_from_args(args: argparse.Namespace) -> list[LoRASettings]:
    """``--adapter`` with its flags, then each ``--adapter-spec``, as LoRASettings (checked: one line each)."""
    from ..settings import LoRASettings

    adapters = []
    if args.adapter:
        adapters.append(LoRASettings(source=args.adapter, weight_name=args.weight_name, revision=args.revision,
                                     alpha=args.alpha, strength=args.scale, mode=args.lora_mode,
                                     skip_parts=tuple(args.skip_parts), any_partition=args.any_partition,
                                     **strength_fields(args)))
    elif any(v is not None for v in (args.weight_name, args.revision, args.alpha)) or strength_fields(args):
        raise H3AppError("--weight-name/--revision/--alpha and the strength flags belong to --adapter: add --adapter "
                         "SOURCE (a further adapter takes them in --adapter-spec).")
    adapters.extend(parse_adapter_spec(spec, args.lora_mode) for spec in args.adapter_spec)
    return adapters


def run(args: argparse.Namespace) -> int:
    import os

    adapters = adapters_from_args(args)  # refused in one line before torch is imported
    from ..backend.presets import resolve_presets
    from ..backend.service import Backend
    from ..hardware.zero_gpu_home import command_time_model
    from ..parallel.follower import bind, follow
    from ..parallel.launch import close_ranks, start_ranks
    from ..request import GenerationRequest
    from .output import emit

    flags = request_flags(args, args.model)  # checked by ``check`` already when run from the command line
    defaults = defaults_for(args.model)
    previews = preview_board(args)
    token = os.environ.get("HF_TOKEN")
    options = load_options(args)  # a bad dtype or a missing GPU: refused before any rank starts
    group = start_ranks(args)  # --ulysses/--ring: None for one rank (docs/multi-gpu.md)
    backend = Backend(args.model, options)
    backend.time_model = command_time_model(args.model, options)  # ZeroGPU: each call's duration (None elsewhere)
    bind(group, backend)
    try:
        if group is not None and not group.leader:
            return follow(group, backend)
        known = None
        for adapter in adapters:  # header only: which adapter is known, before anything is downloaded
            info = backend.inspect(adapter.source, adapter.weight_name, adapter.revision, token,
                                   workflow=args.workflow or T2VA, skip_parts=adapter.skip_parts)
            if info.known is not None:
                from ..adapters.known import KnownAdapter

                known = KnownAdapter(**{k: v for k, v in info.known.items() if k != "source"})
                break
        resolved = resolve_presets({"steps": flags.steps, "shift": args.shift, "audio_shift": args.audio_shift,
                                    "workflow": flags.workflow}, known, defaults)
        seed = defaults.seed if args.seed is None else args.seed
        request = GenerationRequest(prompt=args.prompt, seed=seed, duration=flags.duration, height=flags.height,
                                    width=flags.width, first_frame=args.first_frame, last_frame=args.last_frame,
                                    references=tuple(args.reference), cache=args.cache, **resolved.fields)
        output = backend.generate(request, adapters, token, previews=previews)
    finally:
        backend.close()
        close_ranks(group)
    import shutil
    from pathlib import Path

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(output.video_path, out)
    Path(output.thumbnail_path).unlink(missing_ok=True)
    from ..adapters.summary import applied_lines, not_applied_lines

    applied = applied_lines(output.settings["adapters"])  # the one summary of what each adapter applied
    left_out = not_applied_lines(output.settings["adapters"])  # and of the keys each one left out
    recipe = recipe_lines(output.settings["adapters"], resolved.fields)  # what the files declare but the run did not
    result = {**output.to_json(), "out": str(out), "presets": list(resolved.notes), "workflow": request.workflow,
              "applied": applied, "not_applied": left_out, "recipe_notes": recipe, **compile_fields(args)}
    result.pop("thumbnail", None)
    if previews is not None:
        result["previews"] = previews.summary()
    names = "; ".join(applied) or "no adapter"
    emit(result, args.json, f"wrote {out}: {result['frames']} frames {result['width']}x{result['height']} @{result['fps']}fps, "
                            f"stereo {result['sample_rate']} Hz, {result['evaluations']} evaluations, {names}, "
                            f"{result['hash']}" + "".join(f"\n  preset: {note}" for note in resolved.notes)
                            + not_applied_text(left_out) + "".join(f"\n  recipe: {line}" for line in recipe)
                            + preview_line(result.get("previews")))
    return 0
