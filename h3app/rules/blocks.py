"""Per-block strength: a factor per main transformer block index or range, ``"0-9:0.5, 40-49:1.2"``.

The factor multiplies the group strengths of every LoRA pair in that block (``transformer_blocks.N.*``: attention,
feed-forward and AdaLN); blocks not named keep 1. Refiner blocks and the input/output modules are not numbered
blocks (their groups, ``refiner`` and ``input_output``, have their own strengths). Ranges may not overlap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import H3AppError
from . import values

MAX_RANGES = 256
BLOCKS_EXAMPLE = "0-9:0.5, 40-49:1.2"  # how ranges are written, as the page and the help show it
_BLOCK = re.compile(r"^transformer_blocks\.(\d+)\.")
_ITEM = re.compile(r"^(\d+)\s*(?:-\s*(\d+))?\s*:\s*(\S+)$")


def block_index(target: str) -> int | None:
    """The main-block index of a canonical target (``transformer_blocks.7.attn.to_q`` → 7), None outside them."""
    match = _BLOCK.match(target)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class BlockStrength:
    """``ranges``: ``(first, last, factor)`` per named range, inclusive, in order, not overlapping."""

    ranges: tuple[tuple[int, int, float], ...] = ()

    def __bool__(self) -> bool:  # "no ranges" reads as unset, as the empty spelling it comes from
        return bool(self.ranges)

    def factor(self, index: int | None) -> float:
        """The factor of main block ``index`` (1 for a block no range names, or None: not a main block)."""
        if index is not None:
            for first, last, factor in self.ranges:
                if first <= index <= last:
                    return factor
        return 1.0

    def factor_of(self, target: str) -> float:
        return self.factor(block_index(target))

    @property
    def highest(self) -> int | None:
        """The largest block index named (None when there are no ranges)."""
        return max((last for _, last, _ in self.ranges), default=None)

    @property
    def label(self) -> str:
        """The canonical spelling (``parse_block_strength(label)`` gives these ranges back)."""
        return ",".join(f"{first}:{factor:g}" if first == last else f"{first}-{last}:{factor:g}"
                        for first, last, factor in self.ranges)

    def check_blocks(self, num_layers: int) -> None:
        """Refuse ranges naming blocks a model of ``num_layers`` main blocks does not have."""
        if self.highest is not None and self.highest >= num_layers:
            raise H3AppError(f"block strength names block {self.highest}, but this model has {num_layers} blocks "
                             f"(0-{num_layers - 1}): use ranges within them.")


def parse_block_strength(text: object, what: str = "block strength") -> BlockStrength:
    """``"0-9:0.5, 40-49:1.2"`` (commas or semicolons between items; ``N:f`` for one block) → ``BlockStrength``;
    empty or None → no ranges."""
    if text is None:
        return BlockStrength()
    if isinstance(text, BlockStrength):
        return text
    if not isinstance(text, str):
        raise H3AppError(f"{what} must be text such as 0-9:0.5,40-49:1.2, got {values.short(text)}.")
    items = [item.strip() for item in values.check_length(text, what).replace(";", ",").split(",") if item.strip()]
    if len(items) > MAX_RANGES:
        raise H3AppError(f"{what} has {len(items)} ranges, more than the {MAX_RANGES} allowed.")
    ranges: list[tuple[int, int, float]] = []
    for item in items:
        match = _ITEM.match(item)
        if match is None:
            raise H3AppError(f"{what}: {values.short(item)} is not FIRST-LAST:FACTOR or BLOCK:FACTOR, e.g. 0-9:0.5.")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise H3AppError(f"{what}: the range {first}-{last} runs backwards; write {last}-{first}.")
        ranges.append((first, last, values.parse_strength(match.group(3), f"{what} of blocks {first}-{last}")))
    ranges.sort()
    for (_, last, _), (first, nxt, _) in zip(ranges, ranges[1:]):
        if first <= last:
            raise H3AppError(f"{what}: block {first} is in two ranges (…-{last} and {first}-{nxt}); give each block "
                             f"one factor.")
    return BlockStrength(tuple(ranges))
