"""Which of H3's two DiTs an adapter file was made for, and the refusal of a file meant for the other one.

MiniMax-H3 ships two transformer partitions: ``transformer/`` (the t2va and fl2va workflows; publishers call its
adapters "FL2VA" or "FL2V") and ``transformer_ref/`` (ref2va; "Ref2VA"). PDD, LightX2V and others publish one file
per partition with the same keys, so the keys cannot tell them apart. The file's partition is read from, in order:

1. its metadata (``partition``, ``task``, ``workflow``, ``task_type``, ``pipeline``, ``modelspec.architecture``,
   ``modelspec.title``): a value naming ``transformer_ref`` or ``ref2v…`` → Ref2VA, ``transformer``, ``fl2v…`` or
   ``t2v…`` → FL2VA;
2. its keys: every key under ``transformer_ref.`` → Ref2VA;
3. its file name, the same words as in the metadata.

Otherwise it is unknown (null), and it applies to either. Applying a known file to the other partition is refused in
one line unless the person overrides it (``--any-partition``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath

from ..errors import H3AppError
from ..rules.choices import FL2VA, MAIN_PARTITION, REF2VA, REFERENCE_PARTITION, T2VA, workflow_partition

METADATA_FIELDS = ("partition", "task", "workflow", "task_type", "pipeline", "modelspec.architecture",
                   "modelspec.title")
_REF = re.compile(r"(?<![a-z])ref2va?(?![a-z])", re.IGNORECASE)
_MAIN = re.compile(r"(?<![a-z])(fl2va?|t2va?)(?![a-z])", re.IGNORECASE)
METADATA, KEYS, NAME = "file_metadata", "keys", "file_name"  # where the partition was read


def _from_text(text: str) -> str | None:
    text = str(text).strip()
    if text == REFERENCE_PARTITION or _REF.search(text):
        return REF2VA
    if text == MAIN_PARTITION or _MAIN.search(text):
        return FL2VA
    return None


def file_partition(metadata: Mapping[str, str], file_partitions: Iterable[str],
                   name: str) -> tuple[str | None, str | None]:
    """``(partition, where it was read)``: ``FL2VA`` / ``REF2VA`` / None (unknown) and ``metadata`` / ``keys`` /
    ``name``. ``file_partitions``: the partition of every module and part (``transformer`` or ``transformer_ref``)."""
    for field in METADATA_FIELDS:
        if metadata.get(field):
            found = _from_text(metadata[field])
            if found is not None:
                return found, METADATA
    found_partitions = set(file_partitions)
    if found_partitions == {REFERENCE_PARTITION}:
        return REF2VA, KEYS
    found = _from_text(PurePosixPath(name).name)
    return (found, NAME) if found is not None else (None, None)


def runs_on(partition: str | None) -> str:
    """The workflows a file of ``partition`` binds to, in words."""
    return f"{REF2VA} (transformer_ref)" if partition == REF2VA else f"{T2VA} and {FL2VA} (transformer)"


def partition_mismatch(name: str, partition: str | None, source: str | None, transformer: str) -> str | None:
    """The one line refusing a file of ``partition`` for the ``transformer`` partition (None when it fits or is
    unknown)."""
    if partition is None or workflow_partition(partition) == transformer:
        return None
    said = {METADATA: "its metadata says so", KEYS: "its keys say so", NAME: "its file name says so"}.get(
        source or "", "the file says so")
    other = FL2VA if partition == REF2VA else REF2VA
    label = "Ref2VA" if partition == REF2VA else "FL2VA"
    return (f"{name} is a {label} adapter ({said}): it binds only to the {runs_on(partition)} DiT, not to "
            f"{runs_on(other)}; pick the adapter's {other} file, or add --any-partition to apply it anyway.")


def check_partition(name: str, partition: str | None, source: str | None, transformer: str,
                    any_partition: bool = False) -> None:
    """Refuse a file meant for the other partition (``H3AppError``), unless ``any_partition``."""
    problem = partition_mismatch(name, partition, source, transformer)
    if problem is not None and not any_partition:
        raise H3AppError(problem)
