"""The size cap on adapter files (hosted mode), and its check.

Sizes are decimal, as the Hugging Face Hub and :func:`h3app.rules.units.format_bytes` show them: a cap given as
``H3APP_MAX_ADAPTER_MB=1.5`` is 1,500,000 bytes and is shown as "1.5 MB". The caps on a header's size are in
``adapters/header_caps.py``.
"""

from __future__ import annotations

from ...errors import H3AppError
from ...rules.units import format_bytes
from ...rules.values import parse_number

MB = 1_000_000
HOSTED_DEFAULT_ADAPTER_MB = 2_000  # a hosted server's cap when H3APP_MAX_ADAPTER_MB is not set (2 GB)


def adapter_size_cap(megabytes: str | float | None, hosted: bool) -> int | None:
    """The adapter file size cap in bytes from ``H3APP_MAX_ADAPTER_MB`` (decimal MB); unset: 2 GB when hosted,
    none otherwise."""
    if megabytes is None or (isinstance(megabytes, str) and not megabytes.strip()):
        return HOSTED_DEFAULT_ADAPTER_MB * MB if hosted else None
    value = parse_number(megabytes, "H3APP_MAX_ADAPTER_MB")
    if value <= 0:
        raise H3AppError(f"H3APP_MAX_ADAPTER_MB must be a positive number of megabytes, got {megabytes!r}.")
    return int(value * MB)


def check_size(size: int | None, max_bytes: int | None, where: str) -> None:
    """Refuse a file of ``size`` bytes (None: unknown) over ``max_bytes`` (None: no cap); ``where`` names it."""
    if max_bytes is None:
        return
    if size is None:
        raise H3AppError(
            f"the size of {where} is unknown, and this server only accepts files up to {format_bytes(max_bytes)}: "
            "use another file."
        )
    if size > max_bytes:
        raise H3AppError(
            f"{where} is {format_bytes(size)}, over this server's limit of {format_bytes(max_bytes)}: use a smaller "
            "adapter, or run h3app on your own machine."
        )
