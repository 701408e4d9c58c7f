"""``export``'s stack: ``--adapter A [--alpha] [--scale] --adapter-spec "B,scale=0.5,…" [--rank R]`` writes one clean
PEFT file whose run at strength 1 is the stack's (``adapters/stack.py``): the pairs concatenate (exact), or with
``--rank`` each target is resized by SVD and the energy kept and the largest per-module error are reported."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..adapters.stack import StackPart
    from ..rules.h3_modules import TransformerShapes
    from ..settings import LoRASettings

ShapesFor = Callable[..., "TransformerShapes"]  # (path, model, partition, qkv_layout) → the shapes to fit


def add_stack_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--adapter-spec", action="append", default=[], metavar="SPEC",
                        help='more adapters of the stack, as generate takes them: "SOURCE,weight=F,rev=R,alpha=A,'
                             'scale=S,blocks=R" (repeatable); the file written is their sum at strength 1')
    parser.add_argument("--rank", type=int, default=None, metavar="R",
                        help="resize every module to at most rank R by SVD (reports the energy kept and the largest "
                             "per-module relative error); without it the stack's ranks concatenate (exact)")


def wants_stack(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "adapter_spec", None)) or getattr(args, "rank", None) is not None


def stack_settings(args: argparse.Namespace) -> list[LoRASettings]:
    """``--adapter`` (with ``--alpha``, ``--scale`` and its strength flags) then each ``--adapter-spec``."""
    from ..rules.choices import UNMERGED
    from ..settings import LoRASettings
    from .model_options import parse_adapter_spec, strength_fields

    first = LoRASettings(source=args.adapter, weight_name=args.weight_name, revision=args.revision, alpha=args.alpha,
                         strength=args.scale, skip_parts=tuple(args.skip_parts), **strength_fields(args))
    return [first, *(parse_adapter_spec(spec, UNMERGED) for spec in args.adapter_spec)]


def load_part(settings: LoRASettings, args: argparse.Namespace, shapes_for: ShapesFor) -> StackPart:
    """Fetch and normalise one adapter of the stack for ``--model``'s shapes (``export.shapes_for``: the one rule;
    its explicit alpha applied)."""
    import os

    from ..adapters.export import refuse_unbakeable
    from ..adapters.known import registry_identity
    from ..adapters.normalise import load_adapter
    from ..adapters.source import fetch
    from ..adapters.stack import StackPart

    blocks = refuse_unbakeable(settings)  # a schedule or a modality factor: one line, before anything is fetched
    file = fetch(settings.source, settings.weight_name, settings.revision, token=os.environ.get("HF_TOKEN"))
    repo_id, filename = registry_identity(str(file.path), settings.weight_name, file.filename, repo_id=file.repo_id)
    shapes = shapes_for(file.path, args.model, args.partition, args.qkv_layout)
    blocks.check_blocks(shapes.num_layers)
    adapter = load_adapter(file.path, shapes=shapes, explicit_alpha=settings.alpha, qkv_layout=args.qkv_layout,
                           partition=args.partition, repo_id=repo_id, filename=filename,
                           adapter_config_path=file.adapter_config_path, skip_parts=settings.skip_parts)
    return StackPart(adapter, settings.strength, blocks, file.describe())


def run_stack(args: argparse.Namespace, shapes_for: ShapesFor) -> int:
    """``export`` of the stack; ``shapes_for``: ``export.shapes_for`` (passed in: this module never imports
    ``export``, which imports it)."""
    from ..adapters.export import export_adapter, parse_export_dtype
    from ..adapters.stack import stack_adapter
    from ..settings import BLOCKS
    from .output import emit

    dtype = parse_export_dtype(args.dtype)
    settings = stack_settings(args)
    for item in settings:  # every refusal before the first download
        from ..adapters.export import refuse_unbakeable

        refuse_unbakeable(item)
    parts = [load_part(item, args, shapes_for) for item in settings]
    adapter, resized = stack_adapter(parts, args.rank)
    result = export_adapter(adapter, args.out, strength=1.0, dtype=dtype, base_model=args.model,
                            source=adapter.identity, partition=args.partition)
    payload: dict[str, Any] = {**result.to_json(), "stack": [{"source": p.name, "strength": p.strength,
                                                              BLOCKS.name: p.blocks.label} for p in parts],
                               "resize": resized.to_json() if resized is not None else None}
    human = (f"wrote {result.weights} and {result.config}: {len(parts)} adapters as one, {result.num_targets} "
             f"targets, r {result.lora_config['r']}, run it at strength 1")
    if resized is not None:
        human += (f"; rank {resized.rank}: {resized.energy_kept:.4%} of the energy kept, largest relative error "
                  f"{resized.max_relative_error:.2e}" + (f" ({resized.worst_target})" if resized.worst_target else ""))
    emit(payload, args.json, human)
    return 0
