"""The model Linears that carry LoRA entries, the mode their weights are in, and the transaction that changes them.

Unmerged, a bound Linear is replaced by its ``LoRALinear`` wrapper (same parent attribute). Merged, the original
Linear is back in place and its weight is ``W0 + Σ scale·B@A``, re-merged from the pristine copy on every change
(never by subtraction), so any sequence of changes ends bitwise equal to a fresh merge.

Transaction rule: once a change starts, an exception anywhere rolls every touched layer back to its previous state
(modules re-installed, weights re-merged from or restored to the pristine copy), so the base weights are bitwise
what they were.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..errors import H3AppError
from ..rules.choices import MERGED, UNMERGED
from .layers import LoRALinear, is_mergeable
from .pristine import PristineStore


@dataclass
class Binding:
    """One bound module: its parent and attribute, the original Linear and the wrapper that carries the entries."""

    path: str
    parent: nn.Module
    attr: str
    wrapper: LoRALinear

    @property
    def original(self) -> nn.Linear:
        return self.wrapper.base

    def install(self, module: nn.Module) -> None:
        if getattr(self.parent, self.attr) is not module:
            setattr(self.parent, self.attr, module)


class BoundLayers:
    """The bound Linears of one transformer by module path, and their engine-wide ``mode`` (``unmerged`` or
    ``merged``). A path stays bound while it has entries or a pristine copy."""

    def __init__(self, transformer: nn.Module, pristine: PristineStore) -> None:
        self.transformer = transformer
        self.pristine = pristine
        self.mode = UNMERGED
        self._bindings: dict[str, Binding] = {}

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(self._bindings)

    @property
    def factor_bytes(self) -> int:
        """Bytes of the factors of every bound entry; a factor shared by several entries counts once."""
        seen: dict[int, int] = {}
        for binding in self._bindings.values():
            for entry in binding.wrapper.lora_entries:
                for factor in (entry.down, entry.up):
                    seen[id(factor)] = factor.nbytes
            for entry in binding.wrapper.exact_entries:
                seen[id(entry)] = entry.nbytes
        return sum(seen.values())

    def binding(self, path: str) -> Binding:
        """The binding of ``path``, made (with a new wrapper) on first use."""
        binding = self._bindings.get(path)
        if binding is None:
            parent_path, _, attr = path.rpartition(".")
            parent = self.transformer.get_submodule(parent_path) if parent_path else self.transformer
            module = getattr(parent, attr)
            wrapper = module if isinstance(module, LoRALinear) else LoRALinear(module)
            binding = self._bindings[path] = Binding(path, parent, attr, wrapper)
        return binding

    def weight(self, path: str) -> torch.Tensor:
        """The weight ``[out, in]`` of the Linear at ``path`` (merged values while merged)."""
        binding = self._bindings.get(path)
        if binding is not None:
            return binding.original.weight
        module = self.transformer.get_submodule(path)
        linear = module.base if isinstance(module, LoRALinear) else module
        if not isinstance(linear, nn.Linear):
            raise H3AppError(f"{path} is a {type(linear).__name__}, not a Linear: no LoRA target sits there.")
        return linear.weight

    def base_rows(self, path: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` of ``path``'s base weight: read from the pristine copy (those rows only) while
        merged weights are in place."""
        return self.pristine.rows(path, start, stop) if path in self.pristine else self.weight(path)[start:stop]

    def check_mergeable(self, paths: Iterable[str]) -> None:
        for path in paths:
            reason = is_mergeable(self.weight(path))
            if reason:
                raise H3AppError(f"merged mode is not available: {path}: {reason}; use unmerged mode.")

    def transaction(self, paths: Iterable[str], change: Callable[[], None], *, mode: str,
                    undo: Callable[[], None] | None = None, exact_paths: Iterable[str] = ()) -> None:
        """Run ``change`` (edits entry lists or scale state), then bring ``paths`` to ``mode``. On any exception:
        ``undo``, restore the entry lists and the previous mode, and bring every touched path back (weights
        re-merged from, or restored to, the pristine copies — bitwise what they were). ``exact_paths``: paths whose
        weights exact parts will be written into whatever the mode (room is reserved for their pristine copies)."""
        paths = list(paths)
        old_mode = self.mode
        self._reserve(paths if mode == MERGED else list(exact_paths))
        saved = {path: (list(self.binding(path).wrapper.lora_entries), list(self.binding(path).wrapper.exact_entries))
                 for path in paths}
        try:
            change()
            self.mode = mode
            self._bring_to_mode(paths, mode)
        except BaseException as error:
            self.mode = old_mode
            try:
                if undo is not None:
                    undo()
                for path, (entries, exact) in saved.items():
                    self._bindings[path].wrapper.lora_entries = entries
                    self._bindings[path].wrapper.exact_entries = exact
                self._bring_to_mode(paths, old_mode)
            except BaseException as rollback_error:  # pragma: no cover - a second failure; report both
                raise H3AppError(
                    f"LoRA change failed ({error}) and so did its rollback ({rollback_error}): reload the model."
                ) from error
            raise
        finally:
            self._release(paths)

    def rewrite(self, paths: list[str]) -> None:
        """Write ``paths``' weights again in the current mode (their entries' tensors or strengths changed in place:
        a head bank's head at each evaluation)."""
        self._bring_to_mode(paths, self.mode)

    def _reserve(self, paths: list[str]) -> None:
        """Room for the pristine copies ``paths`` do not have yet (refused with the reason when none fits)."""
        new = [self.weight(p) for p in paths if p not in self.pristine]
        devices = {w.device for w in new}
        self.pristine.reserve(sum(w.nbytes for w in new), devices.pop() if len(devices) == 1 else None)

    def _release(self, paths: list[str]) -> None:
        """Forget the paths left with neither entries nor a pristine copy."""
        for path in paths:
            binding = self._bindings.get(path)
            if binding is not None and not binding.wrapper.lora_entries and not binding.wrapper.exact_entries \
                    and path not in self.pristine:
                del self._bindings[path]

    def _bring_to_mode(self, paths: list[str], mode: str) -> None:
        """Make each path's installed module and weight match its entries in ``mode``."""
        for path in paths:
            binding = self._bindings[path]
            wrapper = binding.wrapper
            merged = mode == MERGED and bool(wrapper.lora_entries)
            if merged or wrapper.exact_entries:  # the weight is written: W0 (+ exact parts) (+ Σ scale·BA merged)
                binding.install(wrapper if wrapper.lora_entries and not merged else binding.original)
                if path not in self.pristine:
                    self.pristine.put(path, binding.original.weight)
                if merged:
                    wrapper.merge_from(self.pristine, path)
                else:
                    wrapper.write_from(self.pristine, path, with_lora=False)
                continue
            if path in self.pristine:
                wrapper.restore_from(self.pristine, path)
                self.pristine.pop(path)
            binding.install(wrapper if wrapper.lora_entries else binding.original)
