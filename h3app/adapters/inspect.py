"""Inspection: what an adapter is, from its header and 0-dim scalars alone (no weight tensor is read).

``inspect_header`` turns a ``HeaderView`` (local or remote) into an ``AdapterInfo`` — the ``inspect --json``
contract (docs/adapters.md): format, prefix, ranks, the alpha of every target with its source, warnings, hints and the
known-adapter registry entry. With ``shapes`` (the model in use) every target's shape is checked against it and a
misfit is refused; without, the full-size H3 shapes are used to warn only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..rules.h3_modules import TransformerShapes
from . import memo
from .alpha import AlphaResolution, resolve_alphas, summarise
from .fit import check_fit, check_ranks, full_size_warnings
from .formats import MAIN_PARTITION, AdapterPlan, ModulePlan, plan_adapter
from .header import read_local_header
from .kinds import kind_counts
from .known import KnownAdapter, find_known, registry_identity
from .not_applied import NotApplied, classify
from .partition import file_partition, partition_mismatch
from .parts import check_parts_fit, check_skip_parts, part_counts
from .pruned import apply_skips
from .recipe import declared_recipes, recipe_json
from .sglang import sglang_facts
from .training import read_training
from .types import AdapterInfo, HeaderView


@dataclass(frozen=True)
class Analysis:
    """Everything inspection learns: the key plan, the alpha resolution (and the reference partition's own) and the
    resulting ``AdapterInfo``."""

    view: HeaderView
    plan: AdapterPlan
    alphas: AlphaResolution
    reference_alphas: AlphaResolution
    known: KnownAdapter | None
    info: AdapterInfo


def analyse_header(
    view: HeaderView,
    *,
    shapes: TransformerShapes | None = None,
    repo_id: str | None = None,
    filename: str | None = None,
    qkv_layout: str = "auto",
    partition: str = MAIN_PARTITION,
    explicit_alpha: float | None = None,
    skip_parts: tuple[str, ...] = (),
) -> Analysis:
    """Plan the keys, check shapes, resolve alpha; ``H3AppError`` for anything h3app cannot apply correctly.

    Remembered per (view, options): the header readers hand out one view per file version, so inspecting an
    unchanged file again costs a ``stat`` and two look-ups. (A remembered ``Analysis`` holds its view, so that
    view's ``id`` is not reused while it is remembered.) ``skip_parts``: part kinds left out (``adaln``: the AdaLN
    parts of a file built for a pruned checkpoint)."""
    shapes_key = tuple(shapes.linears.items()) if shapes is not None else None
    skip_parts = check_skip_parts(skip_parts)
    key = (id(view), shapes_key, repo_id, filename, qkv_layout, partition, explicit_alpha, skip_parts)
    return memo.ANALYSES.get_or_compute(key, lambda: _analyse(
        view, shapes=shapes, repo_id=repo_id, filename=filename, qkv_layout=qkv_layout, partition=partition,
        explicit_alpha=explicit_alpha, skip_parts=skip_parts))


def _analyse(view: HeaderView, *, shapes: TransformerShapes | None, repo_id: str | None, filename: str | None,
             qkv_layout: str, partition: str, explicit_alpha: float | None, skip_parts: tuple[str, ...]) -> Analysis:
    plan = plan_adapter(view, qkv_layout=qkv_layout, partition=partition)
    warnings = list(plan.warnings)
    plan, skipped = apply_skips(plan, shapes, skip_parts, view.name, warnings)
    all_modules = plan.modules + plan.reference_modules
    check_ranks(all_modules, view.name)  # from the header: a refused file's tensors are never read
    warnings.extend(check_parts_fit(plan.file_parts, shapes, view.name))
    if shapes is not None:
        check_fit(all_modules, shapes, view.name)
    else:
        warnings.extend(f"{view.name} {w}" for w in full_size_warnings(all_modules))
    file_kind, kind_source = file_partition(view.metadata, [p.file_partition for p in all_modules] + [
        p.file_partition for p in plan.file_parts.parts] + [b.file_partition for b in plan.file_parts.banks], view.name)
    mismatch = partition_mismatch(view.name, file_kind, kind_source, partition)
    if mismatch is not None:
        warnings.append(mismatch)
    known = find_known(repo_id, filename or view.name)
    described = plan.modules or plan.reference_modules
    alphas = resolve_alphas(described, view, explicit_alpha=explicit_alpha, known=known)
    reference_alphas = (resolve_alphas(plan.reference_modules, view, explicit_alpha=explicit_alpha, known=known)
                        if described is plan.modules else alphas)
    warnings.extend(alphas.warnings)
    if not plan.modules and not plan.parts:
        warnings.append(f"nothing in {view.name} applies to the {partition} partition.")
    recipe = recipe_json(declared_recipes(view.metadata, view.sidecars), known.to_json() if known else None)
    warnings.extend(f"{view.name}: {w}" for w in recipe["warnings"])  # a disagreement is shown, never hidden

    ranks = {target: module.rank for module in described for target in module.targets}
    targets = tuple([t for m in plan.modules for t in m.targets])
    choices = alphas.choices.values()
    distinct_ranks = set(ranks.values())
    alpha, alpha_source = summarise(alphas.choices)
    info = AdapterInfo(
        format=plan.format,
        suffix_style=plan.suffix_style,
        prefix=plan.prefix,
        rank=next(iter(distinct_ranks)) if len(distinct_ranks) == 1 else None,
        ranks=ranks,
        alpha=alpha,
        alpha_source=alpha_source,
        alphas=dict(zip(alphas.choices, [choice.alpha for choice in choices])),
        alpha_sources=dict(zip(alphas.choices, [choice.source for choice in choices])),
        num_targets=len(targets),
        targets=targets,
        dtype=plan.dtype,
        file_bytes=view.file_bytes,
        warnings=tuple(dict.fromkeys(warnings)),
        hints=dict(alphas.hints),
        known=known.to_json() if known is not None else None,
        use_rslora=any([choice.use_rslora for choice in choices]),
        unmatched_keys=plan.unmatched_keys,
        reference_targets=tuple([t for m in plan.reference_modules for t in m.targets]),
        sglang=sglang_facts(view, described),
        parts=part_counts(len(plan.modules), plan.parts.parts, plan.parts.banks, kind_counts(plan.modules)),
        partition=file_kind,
        partition_source=kind_source,
        skipped_parts=skipped,
        head_bank_modules=tuple(b.module for b in plan.parts.banks),
        not_applied=keys_not_applied(view, plan, qkv_layout, partition),
        training=read_training(view.metadata),
        recipe=recipe,
    )
    return Analysis(view=view, plan=plan, alphas=alphas, reference_alphas=reference_alphas, known=known, info=info)


def keys_not_applied(view: HeaderView, plan: AdapterPlan, qkv_layout: str, partition: str) -> NotApplied:
    """The keys of ``view`` a run on ``partition`` leaves out, by reason (``not_applied.classify``): the plan's
    unmatched keys, and the other transformer's modules and parts."""
    other_parts = plan.file_parts.keys - plan.parts.keys
    if partition == MAIN_PARTITION:
        other = set(_module_keys(plan.reference_modules)) | other_parts
    elif plan.modules and plan.unmatched_keys:  # for transformer_ref: the main modules are among the unmatched
        other = set(_module_keys(plan_adapter(view, qkv_layout=qkv_layout).modules)) | other_parts
    else:
        other = set(other_parts)
    return classify([*plan.unmatched_keys, *sorted(other - set(plan.unmatched_keys))], other_model=other,
                    partition=partition)


def _module_keys(modules: tuple[ModulePlan, ...]) -> list[str]:
    return [key for module in modules for key in module.keys]


def inspect_header(view: HeaderView, **options: Any) -> AdapterInfo:
    """The ``AdapterInfo`` of a header; ``options`` are :func:`analyse_header`'s keywords."""
    return analyse_header(view, **options).info


def inspect_file(path: str | Path, *, adapter_config_path: str | Path | None = None, **options: Any) -> AdapterInfo:
    """Inspect a local file (``options`` as :func:`analyse_header`). A file inside the Hugging Face cache is matched
    to the registry by its repo."""
    if options.get("repo_id") is None:
        options["repo_id"], options["filename"] = registry_identity(str(path), None,
                                                                    options.get("filename") or Path(path).name)
    return inspect_header(read_local_header(path, adapter_config_path), **options)
