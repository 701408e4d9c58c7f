"""One ``LoRAFactors`` entry per bound module, built from an adapter's matched modules.

Factors go to the bound weight's device (or the engine's factor device) in ``delta_dtype``. On a fused ``to_qkv``,
covered groups that share one ``A`` with one alpha and rank (a native fused source) give a 2D entry
``A [r, in]``, ``B = [B_q; B_k; B_v]`` (zero rows for a missing group); anything else a stacked 3D entry with
per-group scales.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch

from ..adapters.types import ModuleLoRA
from ..errors import H3AppError
from ..rules.blocks import block_index
from ..rules.modality import rows_of
from .delta import stack_group_factors
from .dora import DoRAFactors, dora_norm_terms
from .layers import LoRAFactors, delta_dtype
from .rows import RowFactors
from .scaling import AdapterScale, ModuleAlpha
from .targets import TargetSlot

Convert = Callable[[torch.Tensor], torch.Tensor]
BaseRows = Callable[[int, int], torch.Tensor]  # rows [start, stop) of a base weight


def build_entries(name: str, matched: Mapping[str, ModuleLoRA], slots: Mapping[str, TargetSlot],
                  state: AdapterScale, *, device_of: Callable[[str], torch.device],
                  dtype_of: Callable[[str], torch.dtype],
                  base_of: Callable[[str], tuple[BaseRows, torch.Tensor | None]] | None = None,
                  pad_to: int | None = None) -> dict[str, LoRAFactors]:
    """Module path → entry of adapter ``name``, factors on ``device_of(path)`` in ``delta_dtype`` (fp32; the base's
    half dtype on CUDA) for a base weight of ``dtype_of(path)``. One pass over each factor: a conversion, or none
    when it already is in that dtype and contiguous there. A factor shared by several targets (the one ``A`` of a
    native fused q/k/v bound to split Linears) is converted once, so it is held once on the device. A module with a
    DoRA magnitude gets a ``DoRAFactors`` entry, its norm terms measured on ``base_of(path)``'s rows (the base
    weight's rows reader and its bias)."""
    converted: dict[tuple[int, torch.device, torch.dtype], torch.Tensor] = {}
    by_module: dict[str, list[tuple[TargetSlot, ModuleLoRA]]] = {}
    for target, module in matched.items():
        slot = slots[target]
        by_module.setdefault(slot.module, []).append((slot, module))

    entries: dict[str, LoRAFactors] = {}
    for path, members in sorted(by_module.items()):
        device = device_of(path)
        dtype = delta_dtype(device, dtype_of(path))

        def convert(tensor: torch.Tensor, device: torch.device = device, dtype: torch.dtype = dtype) -> torch.Tensor:
            key = (id(tensor), device, dtype)
            if key not in converted:
                converted[key] = tensor.detach().to(device=device, dtype=dtype).contiguous()
            return converted[key]

        first_slot = members[0][0]
        rows = RowFactors(state.modality, rows_of(first_slot.target), device)
        if first_slot.groups == 1:
            slot, module = members[0]
            scale = state.entry_for(slot.group, (ModuleAlpha.of(module),), device, block_index(slot.target))
            if module.magnitude is not None and base_of is not None:
                base_rows, bias = base_of(path)
                terms = dora_norm_terms(base_rows, slot.out_features, slot.in_features, module.down, module.up)
                entries[path] = DoRAFactors(name, scale, convert(module.down), convert(module.up),
                                            module.magnitude.float().to(device), terms.float().to(device), bias, rows)
                continue
            entries[path] = LoRAFactors(name, scale, convert(module.down), convert(module.up), rows)
            continue
        dora = [slot.target for slot, module in members if module.magnitude is not None]
        if dora:
            raise H3AppError(f"adapter {name!r}: {dora[0]} is a DoRA module on the fused {path} (--fuse-qkv): DoRA "
                             "normalises each output row of its own weight; load the model without --fuse-qkv.")
        by_index: list[ModuleLoRA | None] = [None] * first_slot.groups
        for slot, module in members:
            by_index[slot.index] = module
        entries[path] = _fused_entry(name, state, first_slot, by_index, convert, device, dtype)
        entries[path].modality = rows
    if pad_to is not None:
        for entry in entries.values():
            pad_rank(entry, pad_to)
    return entries


def zero_entries(name: str, paths: Iterable[str], slots: Mapping[str, TargetSlot], state: AdapterScale, rank: int,
                 *, device_of: Callable[[str], torch.device], dtype_of: Callable[[str], torch.dtype]
                 ) -> dict[str, LoRAFactors]:
    """All-zero ``rank``-wide entries of adapter ``name`` on the unfused module ``paths`` it does not cover: under
    ``--compile`` a grid gives every row one entry on the same modules (its delta there is exactly zero), so every
    row runs the same graphs. A fused ``to_qkv`` gets none (its entry's form depends on the groups covered)."""
    by_module = {slot.module: slot for slot in slots.values() if slot.groups == 1}
    entries: dict[str, LoRAFactors] = {}
    for path in sorted(paths):
        slot = by_module.get(path)
        if slot is None:
            continue
        device = device_of(path)
        dtype = delta_dtype(device, dtype_of(path))
        scale = state.entry_for(slot.group, (ModuleAlpha(1.0, rank),), device, block_index(slot.target))
        entries[path] = LoRAFactors(name, scale, torch.zeros(rank, slot.in_features, dtype=dtype, device=device),
                                    torch.zeros(slot.out_features, rank, dtype=dtype, device=device),
                                    RowFactors(state.modality, rows_of(slot.target), device))
    return entries


def pad_rank(entry: LoRAFactors, rank: int) -> None:
    """Zero-pad ``entry``'s factor width (``down [.., r, in]``, ``up [.., out, r]``) up to ``rank``: the delta is the
    same sum with zero terms added; its scale still divides by the module's own rank. Wider entries stay as they
    are. Gives every adapter of a compiled grid one shape per module (``model/compiled.py``)."""
    width = entry.down.shape[-2]
    if width >= rank:
        return
    entry.down = torch.nn.functional.pad(entry.down, (0, 0, 0, rank - width))
    entry.up = torch.nn.functional.pad(entry.up, (0, rank - width))


def _fused_entry(name: str, state: AdapterScale, slot: TargetSlot, by_index: list[ModuleLoRA | None],
                 convert: Convert, device: torch.device, dtype: torch.dtype) -> LoRAFactors:
    """The entry of a fused ``to_qkv`` whose groups ``by_index`` (None where uncovered) the adapter covers."""
    covered = [m for m in by_index if m is not None]
    first = covered[0]
    shared_down = all(same_tensor(m.down, first.down) for m in covered[1:])
    stored = [ModuleAlpha.of(m) if m is not None else None for m in by_index]
    if shared_down and len({s for s in stored if s is not None}) == 1:
        # Native fused source: one A, blocked [B_q; B_k; B_v] (zero rows for an uncovered group): a 2D delta.
        up = torch.zeros(slot.groups * slot.out_features, first.width, dtype=dtype, device=device)
        for index, module in enumerate(by_index):
            if module is not None:
                up[index * slot.out_features:(index + 1) * slot.out_features].copy_(module.up.detach())
        entry = state.entry_for(slot.group, (ModuleAlpha.of(first),), device, block_index(slot.target))
        return LoRAFactors(name, entry, convert(first.down), up)
    down, up = stack_group_factors(
        [(m.down.detach(), m.up.detach()) if m is not None else None for m in by_index],
        out_features_per_group=slot.out_features, in_features=slot.in_features, dtype=dtype, device=device)
    return LoRAFactors(name, state.entry_for(slot.group, tuple(stored), device, block_index(slot.target)), down, up)


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` are one factor (the same object or view, or — with data — equal values)."""
    if a is b:
        return True
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_meta or b.is_meta:
        return False
    if a.device == b.device and a.data_ptr() == b.data_ptr() and a.stride() == b.stride():
        return True
    return bool(torch.equal(a, b))
