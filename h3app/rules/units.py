"""How sizes are written for people: decimal units, as the Hugging Face Hub shows them."""

from __future__ import annotations


def format_bytes(size: int | None) -> str:
    """``1234567`` → ``"1.2 MB"``; None → ``"size unknown"``."""
    if size is None:
        return "size unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"
