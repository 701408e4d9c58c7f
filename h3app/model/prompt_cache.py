"""An LRU cache of text-encoder outputs, so comparisons (A, B, fallback, control, grid cells) encode a prompt once.

The real conditioner is a 32B Qwen3-VL: encoding is a large share of a short Turbo run. The cache sits *inside* the
diffusers pipeline: the workflow's text-encoder sub-block is swapped (in the blocks, before the pipeline is built)
for a subclass that looks its outputs up by a digest of its inputs (prompt, keyframes, references) before running. The outputs are bitwise the ones the step
would have produced, so cached and uncached runs hash the same.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

TEXT_ENCODER_STEP = "text_encoder"


def _feed(digest: "hashlib._Hash", value: Any) -> None:
    """Add ``value`` to ``digest``: strings, numbers, tensors, arrays, PIL images, and containers of them."""
    digest.update(type(value).__name__.encode())
    if value is None or isinstance(value, (str, int, float, bool)):
        digest.update(repr(value).encode())
    elif isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    elif isinstance(value, np.ndarray):
        digest.update(f"{value.dtype}{value.shape}".encode() + np.ascontiguousarray(value).tobytes())
    elif hasattr(value, "tobytes") and hasattr(value, "size") and hasattr(value, "mode"):  # PIL image
        digest.update(f"{value.mode}{value.size}".encode() + value.tobytes())
    elif isinstance(value, (list, tuple)):
        for item in value:
            _feed(digest, item)
    elif isinstance(value, dict):
        for key in sorted(value):
            _feed(digest, key)
            _feed(digest, value[key])
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            _feed(digest, name)
            _feed(digest, getattr(value, name))
    else:
        raise TypeError(f"cannot key the prompt cache on a {type(value).__name__}")


class PromptCache:
    """Thread-safe LRU of ``digest → {output name: tensor}`` with at most ``max_entries`` prompts."""

    def __init__(self, max_entries: int = 32) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key: str, outputs: dict[str, Any]) -> None:
        with self._lock:
            self._entries[key] = outputs
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    def __deepcopy__(self, memo: dict) -> "PromptCache":
        # diffusers deep-copies pipeline blocks; the cache they point at is shared on purpose.
        return self


class _CachedEncoderStep:
    """Mixed in front of a diffusers text-encoder step class (see :func:`install_prompt_cache`)."""

    prompt_cache: PromptCache

    def __call__(self, components: Any, state: Any) -> tuple[Any, Any]:
        block_state = self.get_block_state(state)
        digest = hashlib.sha256(type(self).__mro__[2].__name__.encode())
        for spec in self.inputs:
            _feed(digest, spec.name)
            _feed(digest, getattr(block_state, spec.name, None))
        key = digest.hexdigest()
        cached = self.prompt_cache.get(key)
        if cached is not None:
            for name, value in cached.items():
                setattr(block_state, name, value)
            self.set_block_state(state, block_state)
            return components, state
        components, state = super().__call__(components, state)
        self.prompt_cache.put(key, {spec.name: state.get(spec.name) for spec in self.intermediate_outputs})
        return components, state


def with_prompt_cache(blocks: Any, cache: PromptCache) -> Any:
    """Return ``blocks`` (pipeline blocks pruned to one workflow) with its text-encoder step caching in ``cache``."""
    step = blocks.sub_blocks.get(TEXT_ENCODER_STEP)
    if step is None:
        raise ValueError("these blocks have no text_encoder step to cache")
    if not isinstance(step, _CachedEncoderStep):
        cached_class = type(f"Cached{type(step).__name__}", (_CachedEncoderStep, type(step)), {})
        step = cached_class()
        blocks.sub_blocks[TEXT_ENCODER_STEP] = step
    step.prompt_cache = cache
    return blocks
