"""The canvas rule: sides a positive multiple of the pipeline's ``canvas_multiple``, height × width at most its
``max_pixels``. The CLI checks it before torch (with the known model's values) and the backend with the loaded
pipeline's (``backend.limits``); both refuse in these words."""

from __future__ import annotations

from ..errors import H3AppError


def check_canvas(height: int, width: int, multiple: int, max_pixels: int,
                 names: tuple[str, str] = ("height", "width")) -> None:
    """Refuse ``height`` × ``width`` (pixels) in one line when it breaks the rule; ``names``: how the caller calls
    the two sides (``--height``/``--width`` on the CLI)."""
    for name, value in zip(names, (height, width)):
        if value < multiple or value % multiple:
            raise H3AppError(f"{name} must be a positive multiple of {multiple} for this model, got {count(value)}.")
    if height * width > max_pixels:
        raise H3AppError(f"the canvas {count(height)}×{count(width)} has {count(height * width)} pixels, more than "
                         f"this model generates ({max_pixels:,}, e.g. {largest_16_9(multiple, max_pixels)}): use a "
                         f"smaller canvas.")


def largest_16_9(multiple: int, max_pixels: int) -> str:
    """The largest 16:9-ish canvas within ``max_pixels`` with sides a multiple of ``multiple``, as ``"768×1344"``."""
    short = int((max_pixels * 9 / 16) ** 0.5) // multiple * multiple
    long = max_pixels // max(short, 1) // multiple * multiple
    return f"{short}×{long}"


def count(value: int) -> str:
    """``1,234,567``; absurd sizes in short scientific form (a message never carries a 300-digit number)."""
    return f"{value:,}" if value < 10**12 else f"about 10^{len(str(value)) - 1}"
