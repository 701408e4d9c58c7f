"""Caps on what an adapter file's header may cost to look at, derived from the model rather than guessed.

Header caps (docs/adapters.md, "Header caps"): the largest adapter h3app can apply gives every LoRA-able Linear of
the full-size H3 (``FULL_TARGETS``, 370) a ``lora_A``, a ``lora_B`` and an ``.alpha``, for both transformer
partitions: ``2 × 370 × 3 = 2,220`` tensors. ``MAX_TENSORS`` allows ``TENSOR_MARGIN`` (8) times that (other
components' keys, such as a text encoder's, are listed as unmatched, not refused). ``MAX_HEADER_BYTES`` allows
``ENTRY_BYTES`` (512) of JSON per tensor plus ``METADATA_BYTES`` (8 MB) of ``__metadata__`` (trainers' tag
frequencies and configs). Both are checked on the raw header bytes, before any JSON is parsed.
"""

from __future__ import annotations

from ..errors import H3AppError
from ..rules.choices import PARTITIONS
from ..rules.h3_modules import FULL_SIZE_CONFIG, transformer_shapes

FULL_TARGETS = len(transformer_shapes(FULL_SIZE_CONFIG))
TENSORS_PER_TARGET = 3  # lora_A, lora_B, alpha
TENSOR_MARGIN = 8
MAX_TENSORS = len(PARTITIONS) * FULL_TARGETS * TENSORS_PER_TARGET * TENSOR_MARGIN
ENTRY_BYTES = 512
METADATA_BYTES = 8_000_000  # 8 MB (decimal)
MAX_HEADER_BYTES = MAX_TENSORS * ENTRY_BYTES + METADATA_BYTES
_ENTRY_MARK = b'"data_offsets"'  # once per tensor entry in a safetensors header


def check_header_length(header_len: int, name: str) -> None:
    """Refuse a header longer than ``MAX_HEADER_BYTES`` (its 8-byte length prefix is all that was read)."""
    if header_len > MAX_HEADER_BYTES:
        raise H3AppError(
            f"{name} is not a valid safetensors file for an H3 adapter: its first 8 bytes claim a {header_len:,}-byte "
            f"header, more than any H3 LoRA needs (limit {MAX_HEADER_BYTES:,}); re-download it or pick another "
            ".safetensors file."
        )


def check_tensor_count(raw_header: bytes, name: str) -> None:
    """Refuse a header with more than ``MAX_TENSORS`` entries, counted on the raw bytes before JSON parsing."""
    count = raw_header.count(_ENTRY_MARK)
    if count > MAX_TENSORS:
        raise H3AppError(
            f"{name}: its header lists about {count:,} tensors, more than any H3 adapter has (limit {MAX_TENSORS:,}: "
            "a LoRA on every Linear of both transformers, with margin): it is not an H3 LoRA; pick another file."
        )
