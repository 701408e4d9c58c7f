"""The parameters that exact parts change and that are not a Linear's weight: biases and RMSNorm weights (1-D).

Each is written in place from its pristine copy (kept in the engine's ``PristineStore`` under the parameter's name):
``P = P0 + Σ strength · Δ`` in fp32, rounded once, or a replacement. With no entry left the pristine copy is put back
bit for bit and dropped. Every change is a transaction: on any exception the entry lists are restored and every
touched parameter is rewritten from its pristine copy, so the parameters are bitwise what they were.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from ..errors import H3AppError
from .exact import BankHead, ExactEntry, parameter_of
from .pristine import PristineStore

Entry = ExactEntry | BankHead


class ParamPatches:
    """Exact entries on non-Linear-weight parameters of one transformer, by parameter name."""

    def __init__(self, transformer: torch.nn.Module, pristine: PristineStore) -> None:
        self.transformer = transformer
        self.pristine = pristine
        self.entries: dict[str, list[Entry]] = {}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.entries)

    def of_adapter(self, adapter: str) -> list[str]:
        return [name for name, entries in self.entries.items() if any(e.adapter == adapter for e in entries)]

    def add(self, name: str, entry: Entry) -> None:
        self.entries.setdefault(name, []).append(entry)

    def remove_adapter(self, adapter: str, names: Iterable[str]) -> None:
        for name in names:
            kept = [e for e in self.entries.get(name, []) if e.adapter != adapter]
            if kept:
                self.entries[name] = kept
            else:
                self.entries.pop(name, None)

    def transaction(self, names: Iterable[str], change: Callable[[], None]) -> None:
        """Run ``change`` (edits the entry lists or their strengths), then rewrite ``names``; on any exception put the
        lists back and rewrite every one of them from its pristine copy."""
        names = list(dict.fromkeys(names))
        saved = {name: list(self.entries.get(name, [])) for name in names}
        try:
            change()
            for name in names:
                self.write(name)
        except BaseException:
            for name, entries in saved.items():
                if entries:
                    self.entries[name] = entries
                else:
                    self.entries.pop(name, None)
            for name in names:
                self.write(name)
            raise

    @torch.no_grad()
    def write(self, name: str) -> None:
        """Make ``name`` hold its pristine value with its entries applied (or, with none, its pristine value)."""
        parameter = parameter_of(self.transformer, name)
        entries = self.entries.get(name)
        if parameter is None:
            if entries or name in self.pristine:  # a rollback of a name never written has nothing to do here
                raise H3AppError(f"the model has no parameter {name}: the adapter's exact part for it cannot be "
                                 "written; nothing was applied.")
            return
        if entries:
            if name not in self.pristine:
                self.pristine.put(name, parameter.detach())
            value = self.pristine.full(name).to(device=parameter.device, dtype=torch.float32, copy=True)
            for entry in entries:
                entry.apply(value, 0, value.shape[0])
            parameter.copy_(value)
        elif name in self.pristine:
            parameter.copy_(self.pristine.full(name))
            self.pristine.pop(name)
