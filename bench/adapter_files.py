"""Adapter files for the benchmarks: LightX2V-shaped safetensors with real (random) data, written once and reused.

The layout is LightX2V's H3 Turbo: diffusers module names with PEFT's ``.default.`` slot and no prefix, rank-r
``lora_A``/``lora_B`` on the six attention/FFN Linears of every main and refiner block (``attn.to_q/k/v``,
``attn.to_out.0``, ``ff.net.0.proj``, ``ff.net.2``), and the training alpha in ``__metadata__`` (``alpha``), which
both h3app and diffusers honour. At full size that is 52 blocks × 6 × 2 = 624 tensors, 1.29 GiB in bf16.

Files are streamed tensor by tensor (never the whole file in RAM), written to ``*.partial`` and renamed when
complete, so an interrupted write is never mistaken for a cached file. The file name carries a digest of the layout,
so a changed layout is written afresh instead of silently reusing an old file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
WRITE_CHUNK_ELEMENTS = 1 << 24  # random values generated and written 16 M at a time


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a file: ``key``, shape, dtype, and ``fan_in`` (the scale of its random values, 1/√fan_in)."""

    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    fan_in: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


def lightx2v_layout(config: Mapping[str, Any], rank: int, dtype: torch.dtype = torch.bfloat16) -> list[TensorSpec]:
    """LightX2V's keys for a transformer ``config`` (a diffusers config dict): ``A [r, in]``, ``B [out, r]`` per target
    of every main and refiner block, in the model's module order."""
    from h3app.rules.h3_modules import is_block_linear, transformer_shapes

    specs: list[TensorSpec] = []
    for target, linear in transformer_shapes(config).linears.items():
        if not is_block_linear(target):
            continue
        specs.append(TensorSpec(f"{target}.lora_A.default.weight", (rank, linear.in_features), dtype,
                                linear.in_features))
        # B's values scale with 1/√rank so that B·A·x stays of the order of x for unit-scale inputs.
        specs.append(TensorSpec(f"{target}.lora_B.default.weight", (linear.out_features, rank), dtype, rank))
    return specs


def layout_digest(specs: Sequence[TensorSpec], metadata: Mapping[str, str], seed: int) -> str:
    """A short digest of everything that determines a file's bytes."""
    digest = hashlib.sha256()
    digest.update(json.dumps([[s.key, list(s.shape), str(s.dtype), s.fan_in] for s in specs]).encode())
    digest.update(json.dumps(dict(metadata), sort_keys=True).encode())
    digest.update(str(seed).encode())
    return digest.hexdigest()[:12]


def _header_bytes(specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> bytes:
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    cursor = 0
    for spec in specs:
        header[spec.key] = {"dtype": SAFETENSORS_DTYPES[spec.dtype], "shape": list(spec.shape),
                            "data_offsets": [cursor, cursor + spec.nbytes]}
        cursor += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors' own writer does


def expected_size(specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> int:
    return 8 + len(_header_bytes(specs, metadata)) + sum(s.nbytes for s in specs)


def write_safetensors(path: Path, specs: Sequence[TensorSpec], metadata: Mapping[str, str], seed: int) -> Path:
    """Stream a valid safetensors file with seeded uniform random values (±√3/√fan_in: unit variance × 1/√fan_in).

    Peak memory is one 16 M-element chunk, whatever the file size.
    """
    generator = torch.Generator().manual_seed(seed)
    raw = _header_bytes(specs, metadata)
    partial = path.with_name(path.name + ".partial")
    path.parent.mkdir(parents=True, exist_ok=True)
    with partial.open("wb") as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        for spec in specs:
            bound = math.sqrt(3.0 / spec.fan_in)
            remaining = math.prod(spec.shape)
            while remaining:
                count = min(remaining, WRITE_CHUNK_ELEMENTS)
                chunk = torch.empty(count, dtype=torch.float32).uniform_(-bound, bound, generator=generator)
                handle.write(chunk.to(spec.dtype).view(torch.uint8).numpy().tobytes())
                remaining -= count
    os.replace(partial, path)
    return path


def adapter_file_path(cache_dir: Path, stem: str, specs: Sequence[TensorSpec], metadata: Mapping[str, str],
                      seed: int = 0) -> Path:
    """Where the file for this layout lives in ``cache_dir`` (written or not)."""
    return Path(cache_dir) / f"{stem}-{layout_digest(specs, metadata, seed)}.safetensors"


def is_cached(path: Path, specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> bool:
    """The file exists and has exactly the size its layout implies (an interrupted write never gets this far)."""
    return path.is_file() and path.stat().st_size == expected_size(specs, metadata)


def cached_adapter_file(cache_dir: Path, stem: str, specs: Sequence[TensorSpec], metadata: Mapping[str, str],
                        seed: int = 0) -> tuple[Path, bool]:
    """``(path, written_now)``: the file for this layout in ``cache_dir``, written first if absent or of the wrong
    size."""
    path = adapter_file_path(cache_dir, stem, specs, metadata, seed)
    if is_cached(path, specs, metadata):
        return path, False
    return write_safetensors(path, specs, metadata, seed), True


def default_cache_dir() -> Path:
    """``$H3APP_BENCH_CACHE``, else ``$XDG_CACHE_HOME/h3app-bench`` (``~/.cache/h3app-bench``): outside the
    repository, so a 1.3 GB fixture never shows up in ``git status``."""
    configured = os.environ.get("H3APP_BENCH_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "h3app-bench"
