"""``python -m h3app export --adapter SOURCE [--weight-name F] [--revision R] [--model M] [--alpha A] [--scale S]
[--partition P] --out DIR [--dtype D] [--json]`` (contract in docs/architecture.md; the keys are prefixed with the
partition, which is where diffusers loads them).

Writes a clean diffusers/PEFT adapter (``adapter_model.safetensors`` + ``adapter_config.json``) whose alpha bakes in
the chosen alpha and strength, so diffusers and PEFT apply exactly h3app's ΔW. Without ``--model`` the shapes are
those of the full-size H3, or of the embedded tiny checkpoint when the adapter fits that instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from .export_stack import add_stack_flags, run_stack, wants_stack
from .inspect import add_source_flags
from .model_options import add_strength_flags, strength_fields

if TYPE_CHECKING:  # heavy imports stay inside functions
    from ..rules.h3_modules import TransformerShapes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a clean diffusers/PEFT adapter with alpha and strength baked in")
    p.add_argument("--adapter", required=True, help="Hub repo id, HF resolve/blob URL, or local file/folder")
    add_source_flags(p)
    p.add_argument("--model", default=None, help="model whose shapes the adapter must fit (tiny, folder, repo id)")
    p.add_argument("--alpha", type=float, default=None, help="explicit alpha (default: the alpha chain's value)")
    p.add_argument("--scale", type=float, default=1.0, help="strength baked into the exported alpha")
    p.add_argument("--dtype", default="float32", help="factor dtype: float32 (default), bfloat16 or float16")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_strength_flags(p)  # the block strength is baked in; a schedule or a modality strength is refused
    add_stack_flags(p)  # --adapter-spec (more adapters: the stack as one file), --rank (SVD resize)
    p.set_defaults(run=run)


def shapes_for(path: Path, model: str | None, partition: str, qkv_layout: str) -> TransformerShapes:
    """The model's shapes, or (no ``--model``) the full-size H3's, or the tiny checkpoint's if the file fits that."""
    from ..adapters.fit import misfits
    from ..adapters.formats import plan_adapter
    from ..adapters.header import read_local_header
    from ..errors import H3AppError
    from ..model.repo import TINY, read_transformer_config
    from ..rules.h3_modules import FULL_SIZE_CONFIG, transformer_shapes
    from .inspect import model_shapes

    shapes = model_shapes(model, partition)
    if shapes is not None:
        return shapes
    plan = plan_adapter(read_local_header(path), qkv_layout=qkv_layout, partition=partition)
    modules = plan.modules + plan.reference_modules
    for config in (lambda: FULL_SIZE_CONFIG, lambda: read_transformer_config(TINY, partition)):
        shapes = transformer_shapes(config())
        if not misfits(modules, shapes):
            return shapes
    raise H3AppError(
        f"{path.name} fits neither the full-size H3 nor the tiny checkpoint: give the model it is for with --model."
    )


def run(args: argparse.Namespace) -> int:
    if wants_stack(args):  # several adapters, or a resize: export_stack.py
        return run_stack(args, shapes_for)
    import os

    from ..adapters.export import export_adapter, parse_export_dtype, refuse_unbakeable
    from ..adapters.known import registry_identity
    from ..adapters.normalise import load_adapter
    from ..adapters.source import fetch
    from ..settings import LoRASettings
    from .output import emit

    dtype = parse_export_dtype(args.dtype)
    advanced = LoRASettings(source=args.adapter, **strength_fields(args))
    refuse_unbakeable(advanced)  # before anything is fetched
    adapter_file = fetch(args.adapter, args.weight_name, args.revision, token=os.environ.get("HF_TOKEN"))
    path = Path(adapter_file.path)
    repo_id: str | None  # None: a local file the registry does not name
    if adapter_file.repo_id is not None:
        repo_id, filename = adapter_file.repo_id, adapter_file.filename
    else:
        repo_id, filename = registry_identity(str(path), None, path.name)
    shapes = shapes_for(path, args.model, args.partition, args.qkv_layout)
    advanced.blocks.check_blocks(shapes.num_layers)
    adapter = load_adapter(
        path, shapes=shapes, explicit_alpha=args.alpha,
        qkv_layout=args.qkv_layout, partition=args.partition, repo_id=repo_id, filename=filename,
        adapter_config_path=adapter_file.adapter_config_path, skip_parts=tuple(args.skip_parts),
    )
    base_weights = None
    if adapter.has_magnitudes and args.model is not None:  # a DoRA is baked from the base weights its norms read
        from ..adapters.export import baked_targets
        from ..model.base_weights import read_base_weights

        base_weights = read_base_weights(args.model, [f"{t}.weight" for t in baked_targets(adapter)], args.partition,
                                         token=os.environ.get("HF_TOKEN"))
    result = export_adapter(adapter, args.out, strength=args.scale, dtype=dtype, base_model=args.model,
                            source=adapter_file.describe(), partition=args.partition, advanced=advanced,
                            base_weights=base_weights)
    payload = {**result.to_json(), "format": adapter.info.format, "alpha_source": adapter.info.alpha_source,
               "warnings": list(adapter.info.warnings)}
    human = (
        f"wrote {result.weights} and {result.config}: {result.num_targets} targets, strength {result.strength:g}, "
        f"r {result.lora_config['r']}, lora_alpha {result.lora_config['lora_alpha']:g}"
        + (f" (+{len(result.lora_config['alpha_pattern'])} alpha_pattern entries)" if result.lora_config["alpha_pattern"] else "")
    )
    emit(payload, args.json, human + (f"; {result.note}" if result.note else ""))
    return 0
