"""``python -m h3app check``: are two alpha/strength settings with the same alpha × strength bit-identical?

Transformer mode runs one forward of the transformer on a fixed seeded packed input; full mode the whole pipeline.
Both compare setting A, A again (the control), B, and the old fallback (alpha = rank, strength 1). The comparisons themselves live in the backend: ``h3app.backend.transformer_check`` (transformer mode) and
``h3app.backend.equivalence`` (full mode).
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from ..rules.check_pair import DEFAULT_A, DEFAULT_B
from ..rules.choices import CHECK_MODES, FULL_CHECK, TRANSFORMER_CHECK
from ..rules.request_defaults import SEED, defaults_for
from .flag_values import check_setting
from .generate import add_preview_flags, not_applied_text, preview_board, preview_line
from .model_options import add_cache_flag, add_run_flags, check_strengths, compile_fields, load_options, strength_fields

if TYPE_CHECKING:  # heavy imports stay inside functions
    import torch

    from ..adapters.types import NormalisedAdapter
    from ..backend.preview import PreviewBoard
    from ..backend.transformer_check import CheckSetting
    from ..parallel.group import RankGroup
    from ..request import GenerationRequest
    from ..settings import LoRASettings


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="are two alpha/scale settings with the same product bit-identical?")
    add_run_flags(p)
    p.add_argument("--a", default=DEFAULT_A.label, type=check_setting("--a"),
                   help=f"setting A as ALPHA:SCALE (ALPHA may be auto); default {DEFAULT_A.label}")
    p.add_argument("--b", default=DEFAULT_B.label, type=check_setting("--b"),
                   help=f"setting B as ALPHA:SCALE; default {DEFAULT_B.label}")
    p.add_argument("--mode", default=TRANSFORMER_CHECK, choices=CHECK_MODES,
                   help="transformer: one forward on a seeded packed input; full: the whole pipeline (backend)")
    p.add_argument("--seed", type=int, default=None, help=f"default {SEED}")
    p.add_argument("--prompt", default=None, help="full mode only")
    p.add_argument("--steps", type=int, default=None, help="full mode only; default: the model's")
    p.add_argument("--height", type=int, default=None, help="full mode only")
    p.add_argument("--width", type=int, default=None, help="full mode only")
    p.add_argument("--low-rank-only", action="store_true",
                   help="B rescales only the low-rank parts: an adapter's exact deltas (.diff/.diff_b, which alpha "
                        "does not scale) stay at A's strength, the equivalent comparison for such a file")
    add_cache_flag(p)
    add_preview_flags(p, "full mode only, DIR/A, DIR/B and DIR/fallback/step-K.png")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run, check=check_values)  # refused before torch loads


def check_values(args: argparse.Namespace) -> None:
    """The checks across flags (one line each): ``--preview-dir`` and a step cache need ``--mode full``
    (transformer mode runs one forward: nothing to watch denoise, nothing to skip); an approximate attention backend
    is refused (``rules.attention.check_refusal``); the adapter's strengths."""
    from ..errors import H3AppError
    from ..rules.attention import AUTO, BY_NAME, check_refusal
    from ..rules.choices import NO_CACHE

    attention = getattr(args, "attention", AUTO)
    refused = None if attention == AUTO else check_refusal(BY_NAME[attention])
    if refused is not None:
        raise H3AppError(refused)

    if args.preview_dir is not None and args.mode != FULL_CHECK:
        raise H3AppError("--preview-dir needs --mode full: transformer mode runs one forward, there is nothing to "
                         "watch denoise.")
    if args.cache != NO_CACHE and args.mode != FULL_CHECK:
        raise H3AppError(f"--cache {args.cache} skips denoising steps: it needs --mode full (transformer mode runs "
                         f"one forward).")
    check_strengths(args)


def run(args: argparse.Namespace) -> int:
    from ..backend.transformer_check import run_transformer_check
    from ..parallel.launch import close_ranks, start_ranks
    from .output import emit

    a, b = args.a, args.b  # CheckSettings (parsed with the arguments)
    defaults = defaults_for(args.model)
    args.seed = defaults.seed if args.seed is None else args.seed
    args.steps = defaults.steps if args.steps is None else args.steps
    check_values(args)
    adapter_settings, request = _full_job(args)  # the strength flags are checked before anything loads
    previews = preview_board(args)
    options = load_options(args)  # refuses a device this machine lacks before anything loads
    group = start_ranks(args)  # --ulysses/--ring: None for one rank (docs/multi-gpu.md)
    try:
        if args.mode == FULL_CHECK:
            from ..backend.equivalence import FullCheck, run_full_check
            from ..backend.zero_gpu import mode

            result: dict[str, Any] | None = (  # ZeroGPU: the Backend's job, one GPU call (docs/hardware.md)
                run_full_check(FullCheck(args.model, options, adapter_settings, request, a, b, args.low_rank_only,
                                         previews), os.environ.get("HF_TOKEN"))
                if group is None and mode() is None else _full_check_on_ranks(args, a, b, group, previews))
        else:
            from ..model.loader import load_transformer
            from ..parallel.lockstep import on_every_rank

            transformer = load_transformer(args.model, dtype=options.dtype, fuse_qkv=options.fuse_qkv,
                                           revision=options.revision, fp8=options.fp8, device=options.device,
                                           attention=options.attention, split=options.split)
            transformer.to(options.device)
            if options.compile:
                from ..model.compiled import compile_blocks

                compile_blocks(transformer, options.device)
            adapter = on_every_rank(group, lambda: load_check_adapter(args, transformer, group))
            result = on_every_rank(group, lambda: run_transformer_check(transformer, adapter, a=a, b=b,
                                                                       seed=args.seed, source=args.adapter,
                                                                       low_rank_only=args.low_rank_only,
                                                                       advanced=adapter_settings))
            result["model"] = args.model
    finally:
        close_ranks(group)
    if result is None or group is not None and not group.leader:
        return 0  # a follower rank: rank 0 reports
    if group is not None:
        result["parallel"] = group.spec.label
    from ..model.loader import attention_of

    result["attention"] = attention_of(options).name  # every run of the check used it (one loaded model)
    result.update(compile_fields(args))
    if previews is not None:
        result["previews"] = previews.summary()
    verdict = "IDENTICAL" if result["identical"] else f"DIFFERENT (max |diff| {result['max_abs_diff']:.3g})"
    note = f"\n{result['parts_note']}" if result.get("parts_note") else ""
    emit(result, args.json,
         f"{a.label} vs {b.label}: {verdict}; control {'ok' if result['control_identical'] else 'NONDETERMINISTIC'}; "
         f"fallback alpha=rank differs by {result['fallback_max_abs_diff']:.3g}; {result['seconds']:.2f} s{note}"
         + not_applied_text(result.get("not_applied") or []) + preview_line(result.get("previews"))
         + zero_gpu_line(result.get("zerogpu")))
    return 0


def zero_gpu_line(zerogpu: dict[str, Any] | None) -> str:
    """Under ZeroGPU, the calls the check asked for: one, or one per run (``backend/check_calls.py``)."""
    if not zerogpu:
        return ""
    if "calls" not in zerogpu:
        return f"\nZeroGPU: one call of {zerogpu['duration_s']} s ({zerogpu['quota_s']} s of quota asked)"
    asked = ", ".join(f"{run} {duration['quota_s']} s" for run, duration in zip(zerogpu["runs"],
                                                                               zerogpu["durations"]))
    return (f"\nZeroGPU: over one call's {zerogpu['cap_s']} s cap, so run as {zerogpu['calls']} calls, one per run "
            f"(quota asked: {asked})")


def _full_job(args: argparse.Namespace) -> tuple[LoRASettings, GenerationRequest]:
    """The adapter and the request of a full-mode check, from the flags."""
    from ..backend.equivalence import DEFAULT_PROMPT
    from ..request import GenerationRequest
    from ..settings import LoRASettings

    request = GenerationRequest(prompt=args.prompt or DEFAULT_PROMPT, seed=args.seed, steps=args.steps,
                                height=args.height, width=args.width, cache=args.cache)
    return LoRASettings(source=args.adapter, weight_name=args.weight_name, revision=args.revision,
                        skip_parts=tuple(args.skip_parts), any_partition=args.any_partition,
                        **strength_fields(args)), request


def _full_check_on_ranks(args: argparse.Namespace, a: CheckSetting, b: CheckSetting,
                         group: RankGroup | None, previews: PreviewBoard | None = None) -> dict[str, Any] | None:
    """Full mode on several ranks (or, ``group`` None, under ZeroGPU: one GPU call): the same equivalence job as the
    app's, run in step by a Backend per rank; its JSON on rank 0, None on a follower (which served rank 0's jobs)."""
    from ..backend.service import Backend
    from ..hardware.zero_gpu_home import command_time_model
    from ..parallel.follower import bind, follow

    backend = Backend(args.model, load_options(args))
    backend.time_model = command_time_model(args.model, load_options(args))  # ZeroGPU: the call's duration
    bind(group, backend)
    try:
        if group is not None and not group.leader:
            follow(group, backend)
            return None
        adapter, request = _full_job(args)
        result = backend.check_equivalence(request, adapter, a, b, token=os.environ.get("HF_TOKEN"),
                                           low_rank_only=args.low_rank_only, previews=previews)
        return {**result.to_json(), "model": backend.model_name, "output_dir": str(backend.output_dir)}
    finally:
        backend.close()


def load_check_adapter(args: argparse.Namespace, transformer: torch.nn.Module,
                       group: RankGroup | None = None) -> NormalisedAdapter:
    """Fetch ``args.adapter`` (repo id, URL or local path) and normalise it for ``transformer``'s shapes; with
    ranks, shard ``transformer``'s sequence over them first."""
    from ..adapters.normalise import load_adapter
    from ..adapters.source import fetch
    from ..model.loader import config_of
    from ..rules.h3_modules import transformer_shapes

    if group is not None:
        from ..parallel.context_parallel import parallelize

        parallelize(transformer, group.spec)

    fetched = fetch(args.adapter, weight_name=args.weight_name, revision=args.revision)
    return load_adapter(fetched.path, shapes=transformer_shapes(config_of(transformer)),
                        adapter_config_path=fetched.adapter_config_path, repo_id=fetched.repo_id,
                        filename=fetched.filename, skip_parts=tuple(args.skip_parts),
                        any_partition=args.any_partition)
