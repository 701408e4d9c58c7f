"""How sizes are written for people: decimal units, as the Hugging Face Hub shows them."""

from __future__ import annotations

BYTE_UNITS = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def byte_unit(size: int) -> tuple[str, float]:
    """The unit ``size`` bytes is written in, and bytes per unit: ``1_234_567`` → ``("MB", 1e6)``."""
    for unit, scale in BYTE_UNITS:
        if size >= scale:
            return unit, scale
    return "B", 1.0


def format_bytes(size: int | None) -> str:
    """``1234567`` → ``"1.2 MB"``; None → ``"size unknown"``."""
    if size is None:
        return "size unknown"
    unit, scale = byte_unit(size)
    return f"{size / scale:.1f} {unit}" if scale > 1 else f"{size} B"
