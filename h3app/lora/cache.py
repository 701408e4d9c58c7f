"""Normalised adapters kept in memory between jobs, least recently used first out, within a byte budget.

The key names the exact file: ``(source, revision, file, size, sha256)`` — a new commit, a re-upload or another
file of the same repo is another entry. The budget counts the bytes of the tensors held (a tensor shared by
several targets, e.g. the one ``A`` of a native fused q/k/v, counts once).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..adapters.types import NormalisedAdapter
from ..lru import LRU


@dataclass(frozen=True)
class AdapterKey:
    """One adapter file: where it came from and what it was (size in bytes, sha256 hex; either may be unknown)."""

    source: str
    revision: str | None
    file: str | None
    size: int | None
    sha256: str | None


def adapter_nbytes(adapter: NormalisedAdapter) -> int:
    """Bytes of the tensors ``adapter`` holds (main and ``transformer_ref`` modules, exact parts, head banks), each
    storage counted once."""
    seen: set[tuple[str, int]] = set()
    total = 0
    modules = list(adapter.modules.values()) + list(adapter.reference_modules.values())
    tensors = [t for module in modules for t in (module.down, module.up, module.magnitude) if t is not None]
    tensors += [part.tensor for part in adapter.parts.values()]
    tensors += [t for bank in adapter.banks.values() for t in (bank.weight, bank.bias) if t is not None]
    for tensor in tensors:
        if tensor.is_meta:
            continue
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        if key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


class AdapterCache(LRU[AdapterKey, NormalisedAdapter]):
    """LRU cache of normalised adapters with a byte budget (:func:`adapter_nbytes` each). Thread-safe (the UI and
    the worker may both ask); ``put`` returns False, holding nothing new, for an adapter larger than the budget."""

    def __init__(self, budget_bytes: int) -> None:
        super().__init__(budget_bytes, cost=adapter_nbytes)

    @property
    def nbytes(self) -> int:
        return self.held

    get_or_load = LRU.get_or_compute  # the cached adapter, or ``load()`` (outside the lock) then cached
