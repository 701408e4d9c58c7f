"""diffusers' ``_resolve_parallel_config`` places rank r on ``rank % torch.accelerator.device_count()``, which
divides by zero on a machine without accelerator. Where (and only where) no accelerator exists, the count reads 1
for the duration of the call: every CPU rank then uses ``cpu:0``, the only device there is."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_device_without_accelerator() -> Iterator[None]:
    """Inside, ``torch.accelerator.device_count()`` is at least 1; outside (and with a real accelerator) untouched."""
    if torch.accelerator.device_count() > 0:
        yield
        return
    original = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.accelerator.device_count = original  # type: ignore[assignment]
