"""``python -m h3app inspect SOURCE [--weight-name F] [--revision R] [--model M] [--json]`` (contract in docs/architecture.md).

Reads the adapter's header and 0-dim scalars only. With ``--model`` every target's shape is also checked against
that model's transformer config (no weights loaded).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..rules.choices import MAIN_PARTITION, PARTITIONS, QKV_LAYOUTS

if TYPE_CHECKING:  # heavy imports stay inside functions
    from ..adapters.types import HeaderView
    from ..rules.h3_modules import TransformerShapes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="show an adapter's format, ranks and alpha (header only)")
    p.add_argument("source", help="Hub repo id, HF resolve/blob URL, or local file/folder")
    add_source_flags(p)
    p.add_argument("--model", default=None, help="also check every target's shape against this model (tiny, folder, repo id)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def add_source_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--weight-name", default=None, help="file inside the repo or folder")
    p.add_argument("--revision", default=None, help="Hub branch, tag or commit")
    p.add_argument("--qkv-layout", default="auto", choices=QKV_LAYOUTS,
                   help="row order of fused QKV factors: auto (interleaved for DiffSynth), blocked or interleaved")
    p.add_argument("--partition", default=MAIN_PARTITION, choices=PARTITIONS,
                   help="transformer (t2va, fl2va) or transformer_ref (ref2va)")
    p.add_argument("--skip-parts", action="append", default=[], metavar="KIND",
                   help="leave these parts out (adaln: the AdaLN parts of a file built for a pruned H3); repeatable")


def read_source_header(source: str, weight_name: str | None, revision: str | None) -> HeaderView:
    """The ``HeaderView`` of ``source`` (local file/folder, Hub repo id or URL) without downloading weights."""
    import os

    from ..adapters.source import read_header

    return read_header(source, weight_name=weight_name, revision=revision, token=os.environ.get("HF_TOKEN"))


def model_shapes(model: str | None, partition: str) -> TransformerShapes | None:
    """``TransformerShapes`` of ``model``'s transformer config, or None without a model."""
    if model is None:
        return None
    from ..model.repo import read_transformer_config
    from ..rules.h3_modules import transformer_shapes

    return transformer_shapes(read_transformer_config(model, partition=partition))


def summary(info: dict[str, Any]) -> str:
    """Human-readable lines for an ``AdapterInfo.to_json()`` dict."""
    from ..adapters.partition import runs_on
    from ..adapters.parts import describe_counts

    rank = info["rank"] if info["rank"] is not None else "mixed " + ", ".join(str(r) for r in sorted(set(info["ranks"].values())))
    alpha = info["alpha"] if info["alpha"] is not None else "mixed " + ", ".join(f"{a:g}" for a in sorted(set(info["alphas"].values())))
    lines = [
        f"format       {info['format']} ({info['suffix_style']}, prefix {info['prefix']!r})",
        f"targets      {info['num_targets']}" + (f" (+{len(info['reference_targets'])} for transformer_ref)" if info["reference_targets"] else ""),
        f"rank         {rank}",
        f"alpha        {alpha} ({info['alpha_source']})" + (" rsLoRA" if info["use_rslora"] else ""),
        f"dtype        {info['dtype']}, {info['file_bytes']:,} bytes",
    ]
    lines.append(f"parts        {describe_counts(info['parts'], len(info['head_bank_modules']))}")
    if info["skipped_parts"]:
        lines.append("skipped      " + ", ".join(f"{kind} {n}" for kind, n in info["skipped_parts"].items())
                     + " (--skip-parts)")
    partition = info["partition"]
    lines.append(f"partition    {partition} (from its {info['partition_source'].replace('file_', 'file ')}; binds to "
                 f"{runs_on(partition)})"
                 if partition else "partition    unknown (applies to either transformer)")
    if info["known"]:
        known = info["known"]
        extras = ", ".join(f"{k} {known[k]}" for k in ("steps", "shift", "audio_shift", "workflow", "trigger", "scale") if known.get(k) is not None)
        lines.append(f"known        {known['title']}" + (f" ({extras})" if extras else ""))
    left_out = (info.get("not_applied") or {}).get("text")
    if left_out:
        lines.append(f"not applied  {left_out}")
    elif info["unmatched_keys"]:
        lines.append(f"unmatched    {len(info['unmatched_keys'])} keys, e.g. {info['unmatched_keys'][0]}")
    lines.extend(training_lines(info.get("training") or {}))
    from ..adapters.recipe import recipe_words

    lines.extend(f"recipe       {recipe_words(r)}" for r in (info.get("recipe") or {}).get("declared") or ())
    shown = set(((info.get("training") or {}).get("sources") or {}).values())  # said on the training lines
    for name, value in info["hints"].items():
        if name not in shown:
            lines.append(f"hint         {name} = {value}")
    lines.extend(f"warning      {w}" for w in info["warnings"])
    return "\n".join(lines)


def training_lines(training: dict[str, Any]) -> list[str]:
    """What the header metadata says of training (``adapters/training.py``): trainer, progress, trigger words."""
    from ..adapters.training import TrainingInfo

    facts = TrainingInfo.from_json(training).facts()
    lines = [f"training     {' · '.join(facts)}"] if facts else []
    if training.get("trigger_words"):
        source = (training.get("sources") or {}).get("trigger_words")
        lines.append(f"trigger      {', '.join(training['trigger_words'])} (from {source})")
    if training.get("tags"):
        lines.append("tags         " + ", ".join(f"{tag} ×{count}" for tag, count in training["tags"]))
    lines.extend(f"trainer      {key} = {value}" for key, value in (training.get("trainer_settings") or {}).items())
    return lines


def run(args: argparse.Namespace) -> int:
    from ..adapters.inspect import inspect_header
    from ..adapters.known import registry_identity
    from .output import emit

    view = read_source_header(args.source, args.weight_name, args.revision)
    repo_id, filename = registry_identity(args.source, args.weight_name, view.name)
    info = inspect_header(
        view, shapes=model_shapes(args.model, args.partition), repo_id=repo_id, filename=filename,
        qkv_layout=args.qkv_layout, partition=args.partition, skip_parts=tuple(args.skip_parts),
    ).to_json()
    emit(info, args.json, summary(info))
    return 0
