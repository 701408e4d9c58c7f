"""The ``.safetensors`` files a repo or folder offers, and choosing one: the given weight name, or the only file —
never silently the first of several (``MultipleWeightFiles`` carries the list, so the UI can offer a choice).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...errors import H3AppError
from ...rules.units import format_bytes
from .names import WEIGHT_SUFFIX

MAX_NAMES_IN_MESSAGE = 20


@dataclass(frozen=True)
class WeightFile:
    """One ``.safetensors`` file of a repo or folder: ``name`` is its path inside it, ``size`` in bytes."""

    name: str
    size: int | None

    def describe(self) -> str:
        return f"{self.name} ({format_bytes(self.size)})"


class MultipleWeightFiles(H3AppError):
    """Several ``.safetensors`` files and no weight name: the caller must choose one of ``files``."""

    def __init__(self, files: Sequence[WeightFile], where: str) -> None:
        self.files: tuple[WeightFile, ...] = tuple(files)
        self.where = where
        super().__init__(
            f"{where} has {len(self.files)} .safetensors files: {describe_files(self.files)}; choose one with "
            f"--weight-name (e.g. --weight-name {self.files[0].name})."
        )


def describe_files(files: Sequence[WeightFile]) -> str:
    """``a.safetensors (1.2 MB), b.safetensors (300 B)``, at most ``MAX_NAMES_IN_MESSAGE`` names."""
    shown = ", ".join(f.describe() for f in files[:MAX_NAMES_IN_MESSAGE])
    more = len(files) - MAX_NAMES_IN_MESSAGE
    return f"{shown}, … and {more} more" if more > 0 else shown


def choose_weight(files: Sequence[WeightFile], weight_name: str | None = None, *,
                  where: str = "the source") -> WeightFile:
    """The file to use: ``weight_name`` if given (it must be listed), else the only ``.safetensors`` file.

    Several files and no name → ``MultipleWeightFiles`` (``.files`` holds the list); never silently the first.
    ``where`` names the repo or folder in messages.
    """
    weights = [f for f in files if f.name.lower().endswith(WEIGHT_SUFFIX)]
    if weight_name is not None:
        for candidate in weights:
            if candidate.name == weight_name:
                return candidate
        if not weights:
            raise H3AppError(f"{weight_name} is not in {where}, which has no .safetensors files: check the source.")
        raise H3AppError(
            f"{weight_name} is not in {where}; its .safetensors files: {describe_files(weights)}; pass one of these "
            "with --weight-name."
        )
    if not weights:
        raise H3AppError(
            f"{where} has no .safetensors file (pickle formats .bin/.pt/.ckpt are refused: they can run code): "
            "give a source with a .safetensors adapter."
        )
    if len(weights) > 1:
        raise MultipleWeightFiles(weights, where)
    return weights[0]
