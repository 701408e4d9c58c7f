"""Normalisation: an adapter file → ``NormalisedAdapter`` (canonical targets, reordered factors, resolved alpha).

Reads only the factors the plan names (``safe_open``, one tensor at a time) and reorders ``lora_B`` rows into the
diffusers layout of each target:

- fused QKV (native ``qkv_proj``, diffusers ``to_qkv``): lora_A is shared by to_q/to_k/to_v and lora_B ``[3·inner, r]``
  splits into thirds — after de-interleaving ``[q_h, k_h, v_h] × heads`` rows with the *model's* head_dim when the
  layout is interleaved (DiffSynth, or ``qkv_layout="interleaved"``); 3D stacks ``[3, r, in]``/``[3, inner, r]``
  give one (A, B) pair per projection;
- native ``mlp.fc1`` lora_B ``[gate; up]`` → diffusers ``ff.net.0.proj`` ``[up; gate]`` (halves swapped; lora_A is
  untouched because the swap permutes output rows only).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..errors import H3AppError
from ..rules.h3_modules import TransformerShapes
from .alpha import AlphaChoice
from .formats import FUSED_QKV, INTERLEAVED, LORA_KIND, MAIN_PARTITION, SWIGLU_GATE_UP, ModulePlan
from .header import read_local_header
from .inspect import Analysis, analyse_header
from .kinds import BY_NAME
from .known import registry_identity
from .partition import check_partition
from .parts import PartsPlan
from .types import ExactPart, HeadBank, ModuleLoRA, NormalisedAdapter

_DTYPE_WORD = "F32"  # the dtype a read factor is checked as (its file dtype was checked from the header)
FactorReader = Callable[[str], torch.Tensor]  # a factor's key → its tensor (lora_A [r, in], lora_B [out, r], or 3D)


def load_adapter(
    path: str | Path,
    *,
    shapes: TransformerShapes,
    explicit_alpha: float | None = None,
    qkv_layout: str = "auto",
    partition: str = MAIN_PARTITION,
    repo_id: str | None = None,
    filename: str | None = None,
    adapter_config_path: str | Path | None = None,
    skip_parts: tuple[str, ...] = (),
    any_partition: bool = False,
) -> NormalisedAdapter:
    """Load ``path`` for the transformer described by ``shapes``; ``H3AppError`` for anything that would not apply
    exactly (misfit shapes, NaN/Inf factors, unknown layouts, a file made for the other partition unless
    ``any_partition``, a pruned-base file unless ``skip_parts`` holds ``adaln``, …)."""
    path = Path(path)
    if repo_id is None:  # the one registry rule (a file in the Hugging Face cache, a demo adapter, …)
        repo_id, filename = registry_identity(str(path), None, filename or path.name)
    view = read_local_header(path, adapter_config_path)
    analysis = analyse_header(
        view, shapes=shapes, repo_id=repo_id, filename=filename, qkv_layout=qkv_layout, partition=partition,
        explicit_alpha=explicit_alpha, skip_parts=tuple(skip_parts),
    )
    if not analysis.plan.modules and not analysis.plan.parts:
        raise H3AppError(
            f"nothing in {view.name} applies to the {partition} partition "
            f"({len(analysis.plan.reference_modules)} modules are for transformer_ref): load it for the ref2va workflow."
        )
    check_partition(view.name, analysis.info.partition, analysis.info.partition_source, partition, any_partition)

    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        adapter = normalise(analysis, lambda key: _read_factor(handle, key, view.name), shapes=shapes)
    stat = path.stat()
    identity = (
        f"{repo_id}/{filename or view.name}:{stat.st_size}" if repo_id
        else f"{os.path.realpath(path)}:{stat.st_size}:{stat.st_mtime_ns}"
    )
    return replace(adapter, identity=identity)


def normalise(analysis: Analysis, read_factor: FactorReader, *, shapes: TransformerShapes,
              identity: str = "") -> NormalisedAdapter:
    """``analysis`` (of a header, for ``shapes``) made canonical: every planned module's factors, read with
    ``read_factor``, split into its targets with their resolved alpha; the reference partition's modules with
    their own resolution. Reads every module's lora_A then lora_B, in plan order."""
    modules = _targets(analysis.plan.modules, read_factor, shapes, analysis.alphas.choices)
    reference = _targets(analysis.plan.reference_modules, read_factor, shapes, analysis.reference_alphas.choices)
    parts, banks = read_parts(analysis.plan.parts, read_factor)
    return NormalisedAdapter(info=analysis.info, modules=modules, unmatched_keys=analysis.plan.unmatched_keys,
                             reference_modules=reference, identity=identity, parts=parts, banks=banks)


def read_parts(plan: PartsPlan, read_factor: FactorReader) -> tuple[dict[str, ExactPart], dict[str, HeadBank]]:
    """The exact parts (by parameter) and head banks (by head module) ``plan`` names, read with ``read_factor``."""
    parts = {p.parameter: ExactPart(p.parameter, p.kind, read_factor(p.key), p.key) for p in plan.parts}
    banks = {b.module: HeadBank(b.module, read_factor(b.weight_key),
                                read_factor(b.bias_key) if b.bias_key else None, b.keys) for b in plan.banks}
    return parts, banks


def _targets(plans: Sequence[ModulePlan], read_factor: FactorReader, shapes: TransformerShapes,
             choices: Mapping[str, AlphaChoice]) -> dict[str, ModuleLoRA]:
    """Each module's factors split into its targets' ``ModuleLoRA``, by canonical target."""
    result: dict[str, ModuleLoRA] = {}
    for plan in plans:
        down, up = _pair(plan, read_factor)
        pairs = split_factors(plan, down, up, head_dim=shapes.head_dim)
        # DoRA: the magnitude's rows follow B's (thirds of a QKV, fc1's halves swapped, de-interleaved).
        magnitudes = ([m[:, 0].float().contiguous() for _, m in split_factors(
            plan, down, read_factor(plan.magnitude_key).reshape(-1, 1), head_dim=shapes.head_dim)]
            if plan.magnitude_key else [None] * len(pairs))
        for target, (target_down, target_up), magnitude in zip(plan.targets, pairs, magnitudes):
            choice = choices[target]
            result[target] = ModuleLoRA(target=target, down=target_down, up=target_up, alpha=choice.alpha,
                                        alpha_source=choice.source, use_rslora=choice.use_rslora,
                                        source_keys=plan.keys, scale_rank=plan.rank, kind=plan.kind,
                                        alpha_applies=plan.alpha_applies, magnitude=magnitude)
    return result


def _pair(plan: ModulePlan, read_factor: FactorReader) -> tuple[torch.Tensor, torch.Tensor]:
    """The module's ``(A, B)`` as stored (lora_A, lora_B), or the exact pair its kind's factors make
    (``kinds/``: LoKr's Kronecker, LoHa's Hadamard product, fp32)."""
    if plan.kind == LORA_KIND:
        return read_factor(plan.down_key), read_factor(plan.up_key)
    kind = BY_NAME[plan.kind]
    tensors = {factor: read_factor(key) for factor, key in plan.factor_keys}
    facts = kind.facts(plan.stem, plan.stem, {f: (_DTYPE_WORD, tuple(t.shape)) for f, t in tensors.items()})
    return kind.pair(tensors, facts)


def split_factors(
    plan: ModulePlan, down: torch.Tensor, up: torch.Tensor, *, head_dim: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The ``(A [r, in], B [out, r])`` pair of each of ``plan.targets``, rows in the diffusers layout."""
    if plan.layout == FUSED_QKV:
        if plan.stacked:
            return [(down[i].contiguous(), up[i].contiguous()) for i in range(3)]
        if plan.qkv_order == INTERLEAVED:
            up = deinterleave_qkv(up, head_dim, plan.stem)
        return [(down, part.contiguous()) for part in up.chunk(3, dim=0)]
    if plan.layout == SWIGLU_GATE_UP:
        gate, value = up.chunk(2, dim=0)
        return [(down, torch.cat([value, gate], dim=0))]
    return [(down, up)]


def deinterleave_qkv(up: torch.Tensor, head_dim: int, what: str = "qkv") -> torch.Tensor:
    """Rows ``[q_h, k_h, v_h] × heads`` (each ``head_dim`` rows) → ``[q_all; k_all; v_all]``; ``up`` is ``[3·H·d, r]``."""
    rows, rank = up.shape
    if rows % (3 * head_dim):
        raise H3AppError(
            f"{what}: {rows} fused QKV rows are not a multiple of 3 × head_dim {head_dim}: it is not per-head interleaved "
            "for this model; try qkv_layout=blocked."
        )
    heads = rows // (3 * head_dim)
    return up.reshape(heads, 3, head_dim, rank).permute(1, 0, 2, 3).reshape(rows, rank).contiguous()


def _read_factor(handle: Any, key: str, name: str) -> torch.Tensor:
    tensor = handle.get_tensor(key)
    # A finite sum proves every value finite without a full-size bool tensor; overflow falls back to the exact test.
    if not torch.isfinite(tensor.sum()) and not torch.isfinite(tensor).all():
        bad = int((~torch.isfinite(tensor)).sum())
        raise H3AppError(f"{name}: {key!r} has {bad} NaN/Inf values: the file is damaged; re-download or re-export it.")
    return tensor
