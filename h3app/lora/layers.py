"""LoRA on one ``nn.Linear``: the factors of one adapter on one layer, the unmerged wrapper, and the merge from a
pristine copy.

A layer does not decide its scale: each ``LoRAFactors`` reads the ``ScaleEntry`` that ``h3app.lora.scaling`` shares
between all layers of its kind, so a slider change costs no work here.

Which dtype the unmerged delta runs in is one rule, ``delta_dtype``: on CUDA with a half-precision base (bf16/fp16)
the factors are stored in the base's dtype and ``x·Aᵀ·Bᵀ`` runs on the tensor cores with fp32 accumulation (an fp32
GEMM would run on the CUDA cores at about a fifteenth of the speed); everywhere else (the CPU, fp32 bases) factors
are fp32, the input is cast once and the delta is rounded once into the base output. The effective scale is the
same fp32 value on both paths (the one float64→fp32 product), applied to the rank-space hidden in fp32, so two
settings with the same ``alpha × strength`` stay bit-identical on either path. Merging always runs in fp32.

Oracle tolerance of the half path (against a float64 oracle of the same factors): each output element within
``2⁻⁷ · (|base| + max|delta| of its row) + 2⁻²⁴``: three bf16 roundings (hidden, delta, sum), accumulation in fp32
(``tests/test_lora_dtype.py`` holds it).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .delegate import read_through
from .delta import compute_lora_delta
from .pristine import PristineStore
from .rows import RowFactors
from .scaling import ScaleEntry

MERGE_CHUNK_BYTES = 64 << 20  # fp32 rows merged at a time: bounds the temporary to 64 MiB per layer
FORWARD_CHUNK_BYTES = 512 << 20  # unmerged inference: input/delta rows (in the delta's dtype) processed at a time
HALF_DTYPES = (torch.bfloat16, torch.float16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def delta_dtype(device: torch.device | str, base_dtype: torch.dtype) -> torch.dtype:
    """The dtype an unmerged delta (its factors, its input and its output) runs in on ``device`` for a base of
    ``base_dtype``: the base's own half dtype on CUDA (tensor cores, fp32 accumulation), bf16 for an fp8-stored base
    (layerwise casting computes in bf16), fp32 elsewhere."""
    if torch.device(device).type == "cuda":
        if base_dtype in HALF_DTYPES:
            return base_dtype
        if base_dtype in FP8_DTYPES:
            return torch.bfloat16
    return torch.float32


class LoRAFactors:
    """One adapter's factors on one Linear, on the weight's device in ``delta_dtype`` (fp32, or the base's half
    dtype on CUDA).

    2D: ``down [r, in]``, ``up [out, r]`` (a regular Linear, or a fused ``to_qkv`` whose q/k/v share ``A``: ``up`` is
    the blocked ``[B_q; B_k; B_v]``, zero rows where a group is not covered). 3D: ``down [g, r_max, in]``,
    ``up [g, out_g, r_max]`` with per-group scales (``h3app.lora.delta.stack_group_factors``).
    ``scale``: the shared entry of this kind of layer (per-group effective scales and ranks; rank 0 for a group the
    adapter does not cover). ``modality``: the adapter's modality factors as this layer's rows see them
    (``h3app.lora.rows``), None when the layer has none.
    """

    needs_base = False  # a DoRA entry (``h3app.lora.dora``) also reads the base output / base rows

    def __init__(self, adapter: str, scale: ScaleEntry, down: torch.Tensor, up: torch.Tensor,
                 modality: RowFactors | None = None) -> None:
        self.adapter = adapter
        self.scale = scale
        self.down = down
        self.up = up
        self.stacked = down.ndim == 3
        self.modality = modality

    @property
    def group_ranks(self) -> tuple[int, ...]:
        return self.scale.ranks

    def scale_values(self) -> tuple[float, ...]:
        """Float64 effective scale per group (one value for 2D), as the adapter's settings are now."""
        return self.scale.values

    @property
    def dtype(self) -> torch.dtype:
        """What the delta's input, factors and output are in (``delta_dtype``)."""
        return self.down.dtype

    def row_scales(self, x: torch.Tensor) -> torch.Tensor | None:
        """The modality factor of each row of ``x [..., in]`` (``x.shape[:-1]`` or 0-dim), None when all are 1."""
        return self.modality.rows(x) if self.modality is not None else None

    def delta(self, x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """``[..., out]`` delta for input ``x [..., in]`` already in ``self.dtype``; ``rows``: this input's
        ``row_scales`` (computed once for the whole input, sliced per chunk)."""
        blocks = self.modality.out_blocks() if self.modality is not None else None
        if self.stacked:
            return compute_lora_delta(x, self.down, self.up, group_scales=self.scale.applied, row_scales=rows)
        return compute_lora_delta(x, self.down, self.up, scale=self.scale.applied, row_scales=rows,
                                  out_block_scales=blocks)

    def add_to_weight(self, weight32: torch.Tensor, start: int, stop: int) -> None:
        """``weight32`` holds fp32 rows ``[start, stop)`` of the layer; add ``scale · B @ A`` for those rows."""
        values = self.scale_values()
        if not self.stacked:
            weight32.addmm_(self.up[start:stop].float(), self.down.float(), alpha=values[0])
            return
        out_per_group = self.up.shape[1]
        for index, rank in enumerate(self.group_ranks):
            if rank == 0:
                continue
            group_start, group_stop = index * out_per_group, (index + 1) * out_per_group
            lo, hi = max(start, group_start), min(stop, group_stop)
            if lo >= hi:
                continue
            # The whole padded width: a group's rank (what its scale divides by) may differ from its factors'
            # width (a LoKr's exact pair), and padded columns are zero, which adds exactly nothing.
            weight32[lo - start:hi - start].addmm_(
                self.up[index, lo - group_start:hi - group_start].float(),
                self.down[index].float(), alpha=values[index])

    @property
    def nbytes(self) -> int:
        return self.down.nbytes + self.up.nbytes


def forward_rows_per_chunk(width: int, element_size: int = 4) -> int:
    """Sequence rows per unmerged-forward chunk for rows of ``width`` features of ``element_size`` bytes
    (shape-only, deterministic)."""
    return max(1, FORWARD_CHUNK_BYTES // max(1, width * element_size))


def rows_per_chunk(in_features: int) -> int:
    """Rows of ``in_features`` fp32 values in one ``MERGE_CHUNK_BYTES`` block: merges and norms go by such blocks
    (the count depends on the shape only, so every merge of a layer runs the same arithmetic)."""
    return max(1, MERGE_CHUNK_BYTES // max(1, in_features * 4))


def entry_delta(entry: LoRAFactors, x: torch.Tensor, row: torch.Tensor | None, base: torch.Tensor) -> torch.Tensor:
    """One entry's delta; ``base`` is the base output of these rows (read by DoRA entries only)."""
    return entry.delta(x, row, base) if entry.needs_base else entry.delta(x, row)  # type: ignore[call-arg]


def add_deltas(entries: list[LoRAFactors], x: torch.Tensor, out: torch.Tensor, dtype: torch.dtype,
               rows: list[torch.Tensor | None] | None = None) -> None:
    """``out += Σ entry.delta(x, row)`` for rows ``x [n, in]`` → ``out [n, out]`` (x cast to ``dtype`` once);
    ``rows``: each entry's per-row factors for these ``n`` rows (``LoRAFactors.row_scales``; None: all 1). Every
    delta is formed before ``out`` changes, so a DoRA entry reads the base output."""
    xd = x.to(dtype)
    rows = rows if rows is not None else [None] * len(entries)
    delta = entry_delta(entries[0], xd, rows[0], out)
    for entry, row in zip(entries[1:], rows[1:]):
        delta.add_(entry_delta(entry, xd, row, out))
    out.add_(delta)


class LoRALinear(nn.Module):
    """An ``nn.Linear`` plus LoRA deltas, unmerged: ``base(x) + Σ_adapters scale · (x Aᵀ) Bᵀ``.

    The delta runs in its factors' dtype (``delta_dtype``: fp32 with the input cast once, or the base's half dtype
    on CUDA) and is added to the base output in place. The factors are plain attributes, not parameters or buffers, so the
    wrapper's ``state_dict`` and diffusers' ``get_parameter_dtype`` see only the base Linear.
    """

    def __init__(self, base: nn.Linear) -> None:
        super().__init__()
        self.base = base
        self.lora_entries: list[LoRAFactors] = []
        # Exact parts on the weight (``h3app.lora.exact``): written into it in place, in both modes; never in forward.
        self.exact_entries: list = []

    weight = read_through("base", "weight")
    bias = read_through("base", "bias")
    in_features = read_through("base", "in_features")
    out_features = read_through("base", "out_features")

    def extra_repr(self) -> str:
        return f"adapters={[entry.adapter for entry in self.lora_entries]}"

    def add_entry(self, entry: LoRAFactors) -> None:
        self.lora_entries.append(entry)

    def remove_adapter(self, adapter: str) -> None:
        self.lora_entries = [entry for entry in self.lora_entries if entry.adapter != adapter]
        self.exact_entries = [entry for entry in self.exact_entries if entry.adapter != adapter]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        entries = self.lora_entries
        if not entries:
            return out
        dtype = entries[0].dtype
        rows = [entry.row_scales(x) for entry in entries]  # per-modality factors, None where all are 1
        if torch.is_grad_enabled():
            xd = x.to(dtype)
            delta = entry_delta(entries[0], xd, rows[0], out)
            for entry, row in zip(entries[1:], rows[1:]):
                delta = delta + entry_delta(entry, xd, row, out)
            return torch.add(out, delta).to(out.dtype)
        # Inference: add the delta into the base output in place (one rounding to out's dtype), by row chunks so
        # that neither a cast copy of x nor the delta is ever materialised for the whole sequence.
        out = out.contiguous()
        flat_x = x.reshape(-1, x.shape[-1])
        flat_out = out.view(-1, out.shape[-1])
        flat_rows = [row.reshape(-1) if row is not None and row.ndim else row for row in rows]
        step = forward_rows_per_chunk(max(x.shape[-1], out.shape[-1]), dtype.itemsize)
        if flat_x.shape[0] <= step:  # one chunk, no loop: a compiled graph keeps the row count symbolic
            add_deltas(entries, flat_x, flat_out, dtype, flat_rows)
            return out
        for start in range(0, flat_x.shape[0], step):
            chunk = [row[start:start + step] if row is not None and row.ndim else row for row in flat_rows]
            add_deltas(entries, flat_x[start:start + step], flat_out[start:start + step], dtype, chunk)
        return out

    def merge_from(self, pristine: PristineStore, key: str) -> None:
        """``W = W0 (+ exact parts) + Σ scale · B @ A`` (merged mode): :meth:`write_from` with the LoRA products."""
        self.write_from(pristine, key, with_lora=True)

    @torch.no_grad()
    def write_from(self, pristine: PristineStore, key: str, with_lora: bool) -> None:
        """``W = W0 (+ exact parts) (+ Σ scale · B @ A)``: fp32 from the pristine ``W0``, the exact parts first (a
        replacement, or ``strength · Δ``), then the LoRA products when ``with_lora`` (merged mode), cast once to the
        weight's dtype, by row chunks (the chunk size depends on the shape only, so every merge of a layer runs the
        same arithmetic)."""
        weight = self.base.weight
        for start, stop, merged in pristine.fp32_chunks(key, rows_per_chunk(weight.shape[1]), weight.device):
            for entry in self.exact_entries:
                entry.apply(merged, start, stop)
            lora = self.lora_entries if with_lora else []
            base = merged.clone() if any(e.needs_base for e in lora) else None  # W0 rows for DoRA entries
            for entry in lora:
                if entry.needs_base:
                    entry.add_to_weight(merged, start, stop, base)  # type: ignore[call-arg]
                else:
                    entry.add_to_weight(merged, start, stop)
            weight[start:stop].copy_(merged)

    @torch.no_grad()
    def restore_from(self, pristine: PristineStore, key: str) -> None:
        """``W = W0`` (bitwise) from the pristine copy."""
        weight = self.base.weight
        step = rows_per_chunk(weight.shape[1])
        for start in range(0, weight.shape[0], step):
            stop = min(start + step, weight.shape[0])
            weight[start:stop].copy_(pristine.rows(key, start, stop))


def has_values(tensor: torch.Tensor) -> bool:
    """False for a tensor with a shape but no values: its storage is on the meta device (a meta tensor, or a fake
    tensor standing in for a device one)."""
    return tensor.untyped_storage().device.type != "meta"


def is_mergeable(weight: torch.Tensor) -> str | None:
    """None when merged mode can rewrite ``weight``; else why not (quantised, meta).

    Only a plain tensor's values can be rewritten in place. Quantised means any other layout: a traceable tensor
    subclass (``__tensor_flatten__``: torchao's quantised tensors), any other subclass that holds values, or an
    integer dtype. A shape-only stand-in for a plain tensor (a fake tensor: no values) is accepted."""
    if weight.is_meta:
        return "the transformer is on the meta device (no weights to merge into)"
    data = weight.data
    if hasattr(type(data), "__tensor_flatten__") or (type(data) is not torch.Tensor and has_values(data)):
        return f"its weights are {type(data).__name__} (quantised); quantised bases are unmerged-only"
    if not weight.dtype.is_floating_point:
        return f"its weights are {weight.dtype} (quantised); quantised bases are unmerged-only"
    return None
