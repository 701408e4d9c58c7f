"""What every benchmark case receives: quick or full, how many repeats, where fixtures are cached, how to log."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class BenchContext:
    """``quick``: smaller sizes and fewer repeats (the whole of ``--quick`` fits in 2 minutes on 2 cores).
    ``repeats``: timed runs per measurement (the median is reported), unless a case needs fewer for its
    multi-second operations (``heavy_repeats``). ``clock_override``: ``--clock`` (see ``clock``)."""

    quick: bool
    cache_dir: Path
    repeats: int
    heavy_repeats: int
    log: Callable[[str], None] = field(default=_stderr)
    clock_override: str | None = None

    @classmethod
    def create(cls, *, quick: bool, cache_dir: Path, repeats: int | None = None, clock: str | None = None,
               log: Callable[[str], None] = _stderr) -> BenchContext:
        light = repeats if repeats is not None else (5 if quick else 9)
        heavy = repeats if repeats is not None else (2 if quick else 5)
        return cls(quick=quick, cache_dir=Path(cache_dir), repeats=light, heavy_repeats=heavy, log=log,
                   clock_override=clock)

    def clock(self, natural: str) -> str:
        """The clock a measurement uses: the case's ``natural`` one (``cpu`` for single-threaded compute, ``wall``
        for I/O and multi-threaded work) unless ``--clock`` overrides it."""
        return self.clock_override or natural
