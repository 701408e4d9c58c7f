"""Caches of pipeline sub-block outputs: the text encoder's (prompt embeddings), so comparisons (A, B, fallback,
control, grid cells) encode a prompt once, and, during a comparison only, the two decoders'.

Not the step cache of the denoising loop (``h3app.model.denoise_cache``): nothing here skips a transformer
evaluation. The real conditioner is a 32B Qwen3-VL: encoding is a large share of a short Turbo run. The cache sits *inside* the
diffusers pipeline: the workflow's sub-block (diffusers' ``blocks.sub_blocks``) is swapped (in the blocks, before
the pipeline is built) for a subclass that looks its outputs up by a digest of its inputs (prompt, keyframes,
references; latents for a decoder) before running. The outputs are bitwise the ones the sub-block would have
produced, so cached and uncached runs hash the same.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..lru import LRU

TEXT_ENCODER_STEP = "text_encoder"
DECODE_STEPS = ("decode.video", "decode.audio")


def _feed(digest: hashlib._Hash, value: Any) -> None:
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
        raise TypeError(f"cannot key a sub-block cache on a {type(value).__name__}")


class SubBlockCache(LRU[str, dict[str, Any]]):
    """Thread-safe LRU of ``digest → {output name: value}`` with at most ``max_entries`` entries.

    A cache created with ``enabled=False`` only answers inside ``with cache.enabled():`` and is emptied when that
    block ends (the decode cache: decoded videos are large)."""

    def __init__(self, max_entries: int = 32, enabled: bool = True) -> None:
        super().__init__(max_entries)
        self._always_on = enabled
        self._active = 0
        self._switch = threading.Lock()

    @property
    def on(self) -> bool:
        return self._always_on or self._active > 0

    @contextmanager
    def enabled(self) -> Iterator[None]:
        """Turn the cache on for the duration of the block; a temporary cache is emptied afterwards."""
        with self._switch:
            self._active += 1
        try:
            yield
        finally:
            with self._switch:
                self._active -= 1
                if not self.on:
                    self.clear()

    def __deepcopy__(self, memo: dict) -> SubBlockCache:
        # diffusers deep-copies pipeline blocks; the cache they point at is shared on purpose.
        return self


if TYPE_CHECKING:
    from diffusers.modular_pipelines.modular_pipeline import BlockState, ModularPipelineBlocks, PipelineState

    class _Step(ModularPipelineBlocks):
        """What the step class :class:`_CachedStep` is mixed in front of gives it (diffusers declares ``__call__`` on
        each leaf step class, not on their base)."""

        def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]: ...
else:
    _Step = object  # at run time the mixin's base is the step class it is put in front of


class _CachedStep(_Step):
    """Mixed in front of a diffusers step class (see :func:`with_sub_block_caches`)."""

    output_cache: SubBlockCache

    def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]:
        if not self.output_cache.on:
            return super().__call__(components, state)
        # diffusers annotates get_block_state ``-> dict``; it returns a BlockState
        block_state: BlockState = self.get_block_state(state)  # type: ignore[assignment]
        digest = hashlib.sha256(type(self).__mro__[2].__name__.encode())
        for spec in self.inputs:
            _feed(digest, spec.name)
            _feed(digest, getattr(block_state, spec.name, None))
        key = digest.hexdigest()
        cached = self.output_cache.get(key)
        if cached is not None:
            for name, value in cached.items():
                setattr(block_state, name, value)
            self.set_block_state(state, block_state)
            return components, state
        components, state = super().__call__(components, state)
        self.output_cache.put(key, {spec.name: state.get(spec.name) for spec in self.intermediate_outputs})
        return components, state


def with_sub_block_caches(blocks: Any, caches: dict[str, SubBlockCache]) -> Any:
    """Return ``blocks`` (pipeline blocks pruned to one workflow) with each named sub-block caching in its cache."""
    for name, cache in caches.items():
        step = blocks.sub_blocks.get(name)
        if step is None:
            raise ValueError(f"these blocks have no {name!r} step to cache")
        if not isinstance(step, _CachedStep):
            cached_class = type(f"Cached{type(step).__name__}", (_CachedStep, type(step)), {})
            step = cached_class()
            blocks.sub_blocks[name] = step
        step.output_cache = cache
    return blocks
