"""Local adapter sources: listing a folder's ``.safetensors`` files, the hosted allow-list of local folders, and
whether a source already names the chosen file.

Hosted mode (``allowed_local_dirs``): a local path outside the allowed folders is refused before anything else
about it — its existence included — is looked at.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from pathlib import Path

from ...errors import H3AppError
from ...rules.values import check_length, short
from .names import WEIGHT_SUFFIX, is_given, is_url
from .weights import WeightFile

LocalPath = str | os.PathLike  # a path given as text or Path


def is_allowed_local_path(path: LocalPath, allowed_local_dirs: Sequence[LocalPath]) -> bool:
    """Whether ``path``, symlinks resolved, is one of ``allowed_local_dirs`` or inside one: one ``realpath`` of a
    bounded path and a prefix test per folder, linear in the path's length (``Path.parents`` would be quadratic)."""
    real = os.path.realpath(check_length(os.fspath(path), "the local path"))
    for folder in allowed_local_dirs:
        base = os.path.realpath(folder)
        if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
            return True
    return False


def check_allowed_local_path(path: LocalPath, allowed_local_dirs: Sequence[LocalPath], typed: str | None = None
                             ) -> None:
    """Hosted mode: refuse a local path that, symlinks resolved, is not inside one of ``allowed_local_dirs``. The
    refusal echoes ``typed`` (what the visitor gave, shortened) when given: a relative path resolved would show the
    server's working folder."""
    if is_allowed_local_path(path, allowed_local_dirs):
        return
    shown = short(typed) if typed is not None else os.fspath(path)
    raise H3AppError(
        f"local path {shown} is not allowed on this server (only uploaded files and its own adapter "
        "folders are): upload the file, or give a Hub repo id or URL."
    )


def implied_weight(source: LocalPath, weight_name: str | None, *,
                   allowed_local_dirs: Sequence[LocalPath] | None = None) -> str | None:
    """The weight name to pass along with ``source``, or None when the source already names exactly that file: a
    local file of that name, or a local folder whose only ``.safetensors`` file it is — listed as
    :func:`list_weight_files` lists a folder (recursive, any case of the suffix, hidden folders skipped).

    Hosted mode (``allowed_local_dirs``): a path outside the allowed folders is never looked at; the name passes
    through and :func:`parse_source` refuses the path, so an existing and a missing path get the same answer.
    """
    if weight_name is None or not is_given(weight_name):
        return None
    text = check_length(os.fspath(source), "SOURCE").strip()
    if not text or is_url(text):
        return weight_name
    path = Path(os.path.abspath(Path(text).expanduser()))
    if allowed_local_dirs is not None and not is_allowed_local_path(path, allowed_local_dirs):
        return weight_name
    if path.is_file():
        return None if path.name == posixpath.basename(weight_name) else weight_name
    if path.is_dir():
        return None if [f.name for f in list_local(path)] == [weight_name] else weight_name
    return weight_name


def list_local(folder: Path) -> list[WeightFile]:
    """``.safetensors`` files under ``folder`` (hidden folders such as ``.git`` skipped), sorted by path."""
    found: list[WeightFile] = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.lower().endswith(WEIGHT_SUFFIX) and not name.startswith("."):
                path = Path(root, name)
                found.append(WeightFile(path.relative_to(folder).as_posix(), path.stat().st_size))
    return sorted(found, key=lambda f: f.name)
