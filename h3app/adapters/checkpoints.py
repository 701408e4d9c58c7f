"""One training run's checkpoints as the grid's rows: a folder's or repo's files picked by a glob
(``--weight-name "*.safetensors"``), ordered by training progress and labelled with their epoch, steps and trigger.

Order (docs/adapters.md, "A training run's checkpoints"): :attr:`TrainingInfo.order` (``ss_steps``, then
``ss_epoch``; ai-toolkit's ``training_info``) from each file's header, then the last number in the file's name
(``zorb-e10`` → 10, kohya's ``-000004`` → 4), then the name. A file that records neither sorts first. Only headers
are read (remote: HTTP ranges), never a weight tensor.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import H3AppError
from .training import TrainingInfo, read_training

GLOB_CHARS = "*?["  # a weight name with one of these is a pattern (fnmatch), not a file
_NUMBER = re.compile(r"\d+")


def is_glob(weight_name: str | None) -> bool:
    """Whether ``weight_name`` is a pattern (``*.safetensors``, ``zorb-e?.safetensors``) rather than one file."""
    return weight_name is not None and any(ch in weight_name for ch in GLOB_CHARS)


def name_number(name: str) -> int | None:
    """The last number in a file's stem (``out/zorb-e10.safetensors`` → 10), None when it has none."""
    found = _NUMBER.findall(posixpath.splitext(posixpath.basename(name))[0])
    return int(found[-1]) if found else None


@dataclass(frozen=True)
class Checkpoint:
    """One file of a run: its path inside the folder or repo and what its header says about training."""

    weight_name: str
    training: TrainingInfo

    @property
    def sort_key(self) -> tuple[int, int, int, str]:
        number = name_number(self.weight_name)
        return (*self.training.order, -1 if number is None else number, self.weight_name)

    @property
    def label(self) -> str:
        """``zorb-e10 (epoch 10, 1,200 steps, trigger zorb)``: the file's stem and what is known of it."""
        info = self.training
        facts = [f"epoch {info.epoch}" if info.epoch is not None else "",
                 f"{info.steps:,} steps" if info.steps is not None else "",
                 f"trigger {info.trigger}" if info.trigger else ""]
        stem = posixpath.splitext(posixpath.basename(self.weight_name))[0]
        shown = ", ".join(f for f in facts if f)
        return f"{stem} ({shown})" if shown else stem


def match_files(names: Sequence[str], pattern: str, where: str, limit: int) -> list[str]:
    """The names that ``pattern`` matches (fnmatch, case-sensitive), refused in one line when there are none or
    more than ``limit`` (the grid's row limit on this server)."""
    matched = [name for name in names if fnmatch.fnmatchcase(name, pattern)
               or fnmatch.fnmatchcase(posixpath.basename(name), pattern)]
    if not matched:
        raise H3AppError(f"--weight-name {pattern} matches none of the {len(names)} .safetensors files in {where}: "
                         "check the pattern.")
    if len(matched) > limit:
        raise H3AppError(f"--weight-name {pattern} matches {len(matched)} files in {where}, more than the {limit} "
                         f"rows a grid may have on this server: narrow the pattern.")
    return matched


def order_checkpoints(names: Sequence[str], metadata_of: Callable[[str], Mapping[str, str]]) -> list[Checkpoint]:
    """``names`` as checkpoints in training order; ``metadata_of(name)`` is that file's header metadata."""
    found = [Checkpoint(name, read_training(metadata_of(name) or {})) for name in names]
    return sorted(found, key=lambda c: c.sort_key)
