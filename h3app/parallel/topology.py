"""The ``--ulysses N`` / ``--ring N`` flags: how many ranks share one sequence, and how they split attention."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from ..errors import H3AppError

TIMEOUT_ENV = "H3APP_PARALLEL_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ParallelSpec:
    """``ulysses`` or ``ring`` ranks split the token sequence (diffusers' ContextParallelConfig degrees; one of the
    two is 1); ``timeout_s`` bounds every collective of a job (seconds)."""

    ulysses: int = 1
    ring: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("ulysses", "ring"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise H3AppError(f"--{name} must be a whole number ≥ 1 (ranks), got {value!r}.")
        if self.ulysses > 1 and self.ring > 1:
            raise H3AppError("use --ulysses N or --ring N, not both: one kind alone splits any sequence length.")
        if not self.timeout_s > 0:
            raise H3AppError(f"--parallel-timeout must be a positive number of seconds, got {self.timeout_s!r}.")

    @property
    def world_size(self) -> int:
        return self.ulysses * self.ring

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def label(self) -> str:
        if self.ulysses > 1:
            return f"ulysses {self.ulysses}"
        return f"ring {self.ring}" if self.ring > 1 else "one rank"


def add_parallel_arguments(parser: argparse.ArgumentParser) -> None:
    """The context-parallel flags, shared by every command that loads the model."""
    parser.add_argument("--ulysses", type=int, default=1, metavar="N",
                        help="context parallel: N ranks split the sequence, Ulysses all-to-all attention "
                             "(starts N ranks itself, or joins the ranks of torchrun); docs/multi-gpu.md")
    parser.add_argument("--ring", type=int, default=1, metavar="N",
                        help="context parallel: N ranks with ring attention (CUDA only: needs an attention "
                             "backend that returns the log-sum-exp)")
    parser.add_argument("--parallel-timeout", type=float,
                        default=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)), metavar="SECONDS",
                        help=f"a rank silent this long fails the job with one line (default {DEFAULT_TIMEOUT_S:g}, "
                             f"or ${TIMEOUT_ENV})")


def spec_from_args(args: argparse.Namespace) -> ParallelSpec:
    return ParallelSpec(ulysses=args.ulysses, ring=args.ring, timeout_s=args.parallel_timeout)
