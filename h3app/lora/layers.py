"""LoRA on one ``nn.Linear``: the unmerged wrapper, the merge from a pristine copy, and the shared scale state.

Scale (docs/architecture.md, decision 4): per module ``(alpha × strength × group strength) / rank`` (``/ √rank`` for rsLoRA),
computed in float64 and applied in fp32. ``alpha × strength × group strength`` is one float64 number per adapter
and group held by an ``AdapterScale`` that every layer of the adapter shares; each layer only knows its own rank
(and, when the adapter's stored alphas differ per module, its own alpha). A slider change updates the shared
object — a handful of Python floats — and refills the few shared ``ScaleEntry`` objects (one per kind of layer:
group, alphas, ranks) that the layers read on every forward. So a change costs no work per layer, and two settings with the same float64 ``alpha × strength`` (8 × 1.0 and
128 × 0.0625) run bit-identical arithmetic for every rank.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Callable, Mapping

import torch
import torch.nn as nn

from ..errors import H3AppError
from ..rules.h3_modules import GROUPS
from .delta import compute_lora_delta

MERGE_CHUNK_BYTES = 64 << 20  # fp32 rows merged at a time: bounds the temporary to 64 MiB per layer
FORWARD_CHUNK_BYTES = 512 << 20  # unmerged inference: fp32 input/delta rows processed at a time


class ScaleEntry:
    """The scales one kind of layer applies: float64 ``values`` per group, and ``applied`` (float or fp32 tensor)."""

    __slots__ = ("values", "applied")

    def __init__(self) -> None:
        self.values: tuple[float, ...] = ()
        self.applied: float | torch.Tensor = 0.0


class AdapterScale:
    """The per-adapter scale state shared by all of the adapter's layers.

    ``chain_alpha`` is the alpha chain's value when it is the same for every module, else None (then each layer uses
    its own module alpha while no explicit alpha is set). ``products[group]`` is the float64
    ``alpha × strength × group strength`` (without alpha when module alphas differ and none is explicit).
    """

    def __init__(self, chain_alpha: float | None, alpha: float | None, strength: float,
                 group_strengths: Mapping[str, float]) -> None:
        self.chain_alpha = chain_alpha
        self._entries: dict[tuple, ScaleEntry] = {}
        self.update(alpha, strength, group_strengths)

    def update(self, alpha: float | None, strength: float, group_strengths: Mapping[str, float]) -> None:
        """O(kinds of layers): recompute the few per-group products and refill the shared entries."""
        self.alpha = alpha
        self.strength = float(strength)
        self.group_strengths = {group: float(value) for group, value in group_strengths.items()}
        shared_alpha = alpha if alpha is not None else self.chain_alpha
        self.uses_module_alpha = shared_alpha is None
        base = self.strength if shared_alpha is None else float(shared_alpha) * self.strength
        self.products = {group: base * self.group_strengths.get(group, 1.0) for group in GROUPS}
        for key, entry in self._entries.items():
            self._fill(key, entry)

    def entry_for(self, group: str, module_alphas: tuple[float, ...], divisors: tuple[float, ...],
                  ranks: tuple[int, ...], device: torch.device, stacked: bool) -> "ScaleEntry":
        """The shared scale entry of one kind of layer (same group, alphas, divisors, ranks, device). ``update``
        refills every entry, so a slider change costs O(kinds of layers) — a handful — and no work per layer."""
        key = (group, module_alphas, divisors, ranks, device, stacked)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = ScaleEntry()
            self._fill(key, entry)
        return entry

    def _fill(self, key: tuple, entry: "ScaleEntry") -> None:
        group, module_alphas, divisors, ranks, device, stacked = key
        values = tuple(self.module_scale(group, alpha, divisor) if rank else 0.0
                       for alpha, divisor, rank in zip(module_alphas, divisors, ranks))
        entry.values = values
        # 2D: a Python float, which torch applies in the tensor's dtype (fp32); stacks: an fp32 tensor per group.
        entry.applied = (torch.tensor(values, dtype=torch.float64).to(device=device, dtype=torch.float32)
                         if stacked else values[0])

    def module_scale(self, group: str, module_alpha: float, divisor: float) -> float:
        """The float64 scale of one module: ``products[group] (× module alpha) / divisor``."""
        product = self.products[group]
        if self.uses_module_alpha:
            product = product * module_alpha
        return product / divisor

    def module_alpha_in_use(self, module_alpha: float) -> float:
        """The alpha a module runs at now: explicit, else the chain's (uniform or per module)."""
        if self.alpha is not None:
            return self.alpha
        return self.chain_alpha if self.chain_alpha is not None else module_alpha


class LoRAFactors:
    """One adapter's factors on one Linear, in fp32 on the weight's device.

    2D: ``down [r, in]``, ``up [out, r]`` (a regular Linear, or a fused ``to_qkv`` whose q/k/v share ``A``: ``up`` is
    the blocked ``[B_q; B_k; B_v]``, zero rows where a group is not covered). 3D: ``down [g, r_max, in]``,
    ``up [g, out_g, r_max]`` with per-group scales (``h3app.lora.delta.stack_group_factors``).
    ``module_alphas``/``divisors``/``group_ranks`` have one entry per group (one for 2D); ``group_ranks`` is 0 for a
    group the adapter does not cover.
    """

    def __init__(self, adapter: str, state: AdapterScale, group: str, down: torch.Tensor, up: torch.Tensor,
                 module_alphas: tuple[float, ...], divisors: tuple[float, ...], group_ranks: tuple[int, ...]) -> None:
        self.adapter = adapter
        self.state = state
        self.group = group
        self.down = down
        self.up = up
        self.stacked = down.ndim == 3
        self.module_alphas = module_alphas
        self.divisors = divisors
        self.group_ranks = group_ranks
        self._entry = state.entry_for(group, module_alphas, divisors, group_ranks, down.device, self.stacked)

    def scale_values(self) -> tuple[float, ...]:
        """Float64 scale per group (one value for 2D), as the shared state has them now."""
        return self._entry.values

    def delta(self, x32: torch.Tensor) -> torch.Tensor:
        """``[..., out]`` fp32 delta for fp32 input ``x32 [..., in]``."""
        if self.stacked:
            return compute_lora_delta(x32, self.down, self.up, group_scales=self._entry.applied)
        return compute_lora_delta(x32, self.down, self.up, scale=self._entry.applied)

    def add_to_weight(self, weight32: torch.Tensor, start: int, stop: int) -> None:
        """``weight32`` holds fp32 rows ``[start, stop)`` of the layer; add ``scale · B @ A`` for those rows."""
        values = self.scale_values()
        if not self.stacked:
            weight32.addmm_(self.up[start:stop], self.down, alpha=values[0])
            return
        out_per_group = self.up.shape[1]
        for index, rank in enumerate(self.group_ranks):
            if rank == 0:
                continue
            group_start, group_stop = index * out_per_group, (index + 1) * out_per_group
            lo, hi = max(start, group_start), min(stop, group_stop)
            if lo >= hi:
                continue
            weight32[lo - start:hi - start].addmm_(
                self.up[index, lo - group_start:hi - group_start, :rank], self.down[index, :rank], alpha=values[index]
            )

    @property
    def nbytes(self) -> int:
        return self.down.numel() * self.down.element_size() + self.up.numel() * self.up.element_size()


def forward_rows_per_chunk(width: int) -> int:
    """Sequence rows per unmerged-forward chunk for fp32 rows of ``width`` features (shape-only, deterministic)."""
    return max(1, FORWARD_CHUNK_BYTES // max(1, width * 4))


def rows_per_chunk(in_features: int) -> int:
    """Rows merged at a time (depends on the shape only, so every merge of a layer runs the same arithmetic)."""
    return max(1, MERGE_CHUNK_BYTES // max(1, in_features * 4))


class LoRALinear(nn.Module):
    """An ``nn.Linear`` plus LoRA deltas, unmerged: ``base(x) + Σ_adapters scale · (x Aᵀ) Bᵀ``.

    The delta is computed in fp32 (input cast once, factors kept in fp32) and added to the base output with one
    rounding to the base output's dtype. The factors are plain attributes, not parameters or buffers, so the
    wrapper's ``state_dict`` and diffusers' ``get_parameter_dtype`` see only the base Linear.
    """

    def __init__(self, base: nn.Linear) -> None:
        super().__init__()
        self.base = base
        self.lora_entries: list[LoRAFactors] = []

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def extra_repr(self) -> str:
        return f"adapters={[entry.adapter for entry in self.lora_entries]}"

    def add_entry(self, entry: LoRAFactors) -> None:
        self.lora_entries.append(entry)

    def remove_adapter(self, adapter: str) -> None:
        self.lora_entries = [entry for entry in self.lora_entries if entry.adapter != adapter]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        entries = self.lora_entries
        if not entries:
            return out
        if torch.is_grad_enabled():
            x32 = x.to(torch.float32)
            delta = entries[0].delta(x32)
            for entry in entries[1:]:
                delta = delta + entry.delta(x32)
            return torch.add(out, delta).to(out.dtype)
        # Inference: add the fp32 delta into the base output in place (one rounding to out's dtype), by row chunks
        # so that neither the fp32 copy of x nor the fp32 delta is ever materialised for the whole sequence.
        if not out.is_contiguous():
            out = out.contiguous()
        flat_x = x.reshape(-1, x.shape[-1])
        flat_out = out.view(-1, out.shape[-1])
        step = forward_rows_per_chunk(max(x.shape[-1], out.shape[-1]))
        for start in range(0, flat_x.shape[0], step):
            x32 = flat_x[start:start + step].to(torch.float32)
            delta = entries[0].delta(x32)
            for entry in entries[1:]:
                delta.add_(entry.delta(x32))
            flat_out[start:start + step].add_(delta)
        return out

    @torch.no_grad()
    def merge_from(self, pristine: "PristineStore", key: str) -> None:
        """``W = W0 + Σ scale · B @ A``: fp32 from the pristine ``W0``, cast once to the weight's dtype, by row chunks."""
        weight = self.base.weight
        step = rows_per_chunk(weight.shape[1])
        for start in range(0, weight.shape[0], step):
            stop = min(start + step, weight.shape[0])
            merged = pristine.rows(key, start, stop).to(device=weight.device, dtype=torch.float32, copy=True)
            for entry in self.lora_entries:
                entry.add_to_weight(merged, start, stop)
            weight[start:stop].copy_(merged)

    @torch.no_grad()
    def restore_from(self, pristine: "PristineStore", key: str) -> None:
        """``W = W0`` (bitwise) from the pristine copy."""
        weight = self.base.weight
        step = rows_per_chunk(weight.shape[1])
        for start in range(0, weight.shape[0], step):
            stop = min(start + step, weight.shape[0])
            weight[start:stop].copy_(pristine.rows(key, start, stop))


def _available_ram() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def _total_ram() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().total)


class PristineStore:
    """Pristine (pre-merge) copies of base weights, keyed by module path, for merged mode.

    Copies live in host RAM, or — when RAM is short — in one local safetensors file per weight, read back through
    a memory map. ``reserve`` decides where before anything is copied, and refuses merged mode with the reason when
    neither fits. ``prefer`` forces ``"ram"`` or ``"disk"`` (tests, or a machine the caller knows better).
    """

    def __init__(self, spill_dir: str | Path | None = None, *, prefer: str = "auto",
                 available_ram: Callable[[], int | None] = _available_ram,
                 free_disk: Callable[[Path], int] | None = None) -> None:
        if prefer not in ("auto", "ram", "disk"):
            raise ValueError(f"prefer must be auto, ram or disk, got {prefer!r}")
        self.prefer = prefer
        self._spill_root = Path(spill_dir or os.environ.get("H3APP_PRISTINE_DIR") or tempfile.gettempdir())
        self._spill_dir: Path | None = None
        self._available_ram = available_ram
        self._free_disk = free_disk or (lambda path: shutil.disk_usage(path).free)
        self._ram: dict[str, torch.Tensor] = {}
        self._disk: dict[str, tuple[Path, object]] = {}
        self._where = "ram"

    def __contains__(self, key: str) -> bool:
        return key in self._ram or key in self._disk

    def __len__(self) -> int:
        return len(self._ram) + len(self._disk)

    @property
    def ram_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._ram.values())

    @property
    def disk_keys(self) -> tuple[str, ...]:
        return tuple(self._disk)

    def reserve(self, need_bytes: int) -> str:
        """Choose RAM or disk for ``need_bytes`` more of pristine copies; raise ``H3AppError`` if neither fits."""
        if need_bytes <= 0:
            return self._where
        ram_margin = max(2 << 30, int(0.05 * (_total_ram() or 0)))
        available = self._available_ram()
        ram_ok = available is None or available - need_bytes >= ram_margin
        if self.prefer == "ram" or (self.prefer == "auto" and ram_ok):
            if not ram_ok:
                raise H3AppError(
                    f"merged mode needs {need_bytes / 2**30:.1f} GiB of host RAM for the pristine weights but only "
                    f"{(available or 0) / 2**30:.1f} GiB is free: use unmerged mode, or free RAM."
                )
            self._where = "ram"
            return "ram"
        self._spill_root.mkdir(parents=True, exist_ok=True)
        free = self._free_disk(self._spill_root)
        if free - need_bytes < (1 << 30):
            ram_text = "unknown" if available is None else f"{available / 2**30:.1f} GiB"
            raise H3AppError(
                f"merged mode needs {need_bytes / 2**30:.1f} GiB for the pristine weights, but host RAM "
                f"(free {ram_text}) and {self._spill_root} (free {free / 2**30:.1f} GiB) are both too small: use "
                f"unmerged mode, or point H3APP_PRISTINE_DIR at a disk with room."
            )
        self._where = "disk"
        return "disk"

    def put(self, key: str, weight: torch.Tensor) -> None:
        """Copy ``weight`` (bitwise) to the place ``reserve`` chose. The key appears only once the copy is complete."""
        if key in self:
            return
        if weight.is_meta:
            raise H3AppError("merged mode needs real weights, but the transformer is on the meta device: use unmerged mode.")
        if self._where == "ram":
            copy = torch.empty(weight.shape, dtype=weight.dtype, device="cpu", pin_memory=False)
            copy.copy_(weight.detach())
            self._ram[key] = copy
            return
        from safetensors import safe_open
        from safetensors.torch import save_file

        if self._spill_dir is None:
            self._spill_dir = Path(tempfile.mkdtemp(prefix="h3app-pristine-", dir=self._spill_root))
            weakref.finalize(self, shutil.rmtree, str(self._spill_dir), True)
        path = self._spill_dir / (re.sub(r"[^A-Za-z0-9_.-]", "_", key) + ".safetensors")
        save_file({"weight": weight.detach().to("cpu").contiguous()}, str(path))
        handle = safe_open(str(path), framework="pt", device="cpu")
        self._disk[key] = (path, handle)

    def rows(self, key: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` of the pristine weight (CPU; a view for RAM copies, read from the map for disk)."""
        if key in self._ram:
            return self._ram[key][start:stop]
        _, handle = self._disk[key]
        return handle.get_slice("weight")[start:stop]  # type: ignore[attr-defined]

    def full(self, key: str) -> torch.Tensor:
        if key in self._ram:
            return self._ram[key]
        _, handle = self._disk[key]
        return handle.get_tensor("weight")  # type: ignore[attr-defined]

    def pop(self, key: str) -> None:
        if key in self._ram:
            del self._ram[key]
        elif key in self._disk:
            path, _ = self._disk.pop(key)
            path.unlink(missing_ok=True)


def is_mergeable(weight: torch.Tensor) -> str | None:
    """None when merged mode can rewrite ``weight``; else why not (quantised, meta)."""
    if weight.is_meta:
        return "the transformer is on the meta device (no weights to merge into)"
    if type(weight.data) is not torch.Tensor:
        return f"its weights are {type(weight.data).__name__} (quantised); quantised bases are unmerged-only"
    if not weight.dtype.is_floating_point:
        return f"its weights are {weight.dtype} (quantised); quantised bases are unmerged-only"
    return None


def scale_divisor(rank: int, use_rslora: bool) -> float:
    """rank, or √rank for rsLoRA (float64)."""
    return math.sqrt(rank) if use_rslora else float(rank)
