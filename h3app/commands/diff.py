"""``python -m h3app diff A B [--model M] [--json]``: how two adapters differ — per main block and module group the
norms of their effective deltas and the cosine between them, and one overall cosine (``lora/similarity.py``).

A and B are written as ``--adapter-spec`` is (``SOURCE[,weight=F][,rev=R][,alpha=A][,scale=S][,blocks=R]``), each
at its resolved alpha and strength. Only the two files are read (no model weights); ``--model`` names the model
whose shapes they must fit (default: the full-size H3's, or the tiny checkpoint's when the files fit that).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..rules.choices import UNMERGED
from .model_options import parse_adapter_spec

if TYPE_CHECKING:
    from ..adapters.types import NormalisedAdapter
    from ..settings import LoRASettings

SPEC_HELP = 'SOURCE or "SOURCE,weight=F,rev=R,alpha=A,scale=S,blocks=R" (as --adapter-spec)'


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="how two adapters differ: per block and group norms and cosine of their deltas")
    p.add_argument("a", metavar="A", help=SPEC_HELP)
    p.add_argument("b", metavar="B", help=SPEC_HELP)
    p.add_argument("--model", default=None, help="model whose shapes the adapters fit (tiny, folder, repo id)")
    p.add_argument("--qkv-layout", default="auto", choices=("auto", "blocked", "interleaved"),
                   help="row layout of a fused q/k/v up factor without a tell")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run, check=check_values)


def check_values(args: argparse.Namespace) -> None:
    """Both specs parsed before torch is imported (one line for a bad field)."""
    for spec in (args.a, args.b):
        parse_adapter_spec(spec, UNMERGED)


def load(settings: LoRASettings, model: str | None, qkv_layout: str) -> NormalisedAdapter:
    """Fetch (one file and its json sidecars) and normalise ``settings``' adapter for ``model``'s shapes."""
    import os

    from ..adapters import source as sources
    from ..adapters.known import registry_identity
    from ..adapters.normalise import load_adapter
    from ..rules.choices import MAIN_PARTITION
    from .export import shapes_for

    file = sources.fetch(settings.source, settings.weight_name, settings.revision, token=os.environ.get("HF_TOKEN"))
    shapes = shapes_for(file.path, model, MAIN_PARTITION, qkv_layout)
    # the registry rule generate applies (a known adapter's alpha), as ``AdapterBinder`` does
    repo_id, filename = registry_identity(str(file.path), settings.weight_name, file.filename, repo_id=file.repo_id)
    return load_adapter(file.path, shapes=shapes, qkv_layout=qkv_layout, partition=MAIN_PARTITION,
                        repo_id=repo_id, filename=filename, adapter_config_path=file.adapter_config_path,
                        skip_parts=settings.skip_parts, any_partition=settings.any_partition)


def summary(result: dict[str, Any]) -> str:
    """The overall cosine, then one line per (block, group)."""
    def number(value: float | None) -> str:
        return "—" if value is None else f"{value:+.3f}"

    lines = [f"cosine       {number(result['cosine'])} over {result['modules']} weights "
             f"(‖ΔA‖ {result['norm_a']:.4g}, ‖ΔB‖ {result['norm_b']:.4g})"]
    for row in result["blocks"]:
        where = f"block {row['block']}" if row["block"] is not None else "outside"
        lines.append(f"  {where:<10} {row['group']:<13} cos {number(row['cosine'])}  ‖ΔA‖ {row['norm_a']:.4g}  "
                     f"‖ΔB‖ {row['norm_b']:.4g}")
    lines.extend(f"note         {note}" for note in result["notes"])
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..lora.similarity import compare_adapters
    from .output import emit

    settings = [parse_adapter_spec(spec, UNMERGED) for spec in (args.a, args.b)]
    adapters = [load(s, args.model, args.qkv_layout) for s in settings]
    result = compare_adapters(adapters[0], settings[0], adapters[1], settings[1]).to_json()
    result = {"a": args.a, "b": args.b, **result}
    emit(result, args.json, summary(result))
    return 0
