"""The text a user gives for an adapter source, checked without any network access or file system look-up:
repo ids, revisions, weight names (paths inside a repo or folder) and folder paths. Only ``.safetensors``:
``.bin/.pt/.pth/.ckpt`` are pickles, which run code when loaded, and are refused by name wherever they appear.
"""

from __future__ import annotations

import posixpath
import re

from ...errors import H3AppError
from ...rules.values import MAX_NAME_PART_CHARS, check_length, short
from ..header import PICKLE_SUFFIXES

WEIGHT_SUFFIX = ".safetensors"

COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
_REVISION = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+\-/]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_REPO_ID_SHAPE = re.compile(r"^[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*$")


def is_url(text: str) -> bool:
    """``scheme://…`` (only http(s) Hub URLs are accepted later, with a message for the rest)."""
    return _URL_SCHEME.match(text) is not None


def looks_like_repo_id(text: str) -> bool:
    """``owner/name`` in the Hub's alphabet (not validated further: see ``check_repo_id``)."""
    return _REPO_ID_SHAPE.match(text) is not None


def is_given(value: object) -> bool:
    """None and blank text (an empty UI box) mean "not given"."""
    return value is not None and not (isinstance(value, str) and not value.strip())


def check_repo_id(repo_id: str) -> str:
    """A Hub model repo id ``owner/name`` (huggingface_hub's validator, plus: the owner is required)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if repo_id.count("/") != 1:
        raise H3AppError(
            f"{repo_id!r} is not a Hub repo id, nor an existing local path: use owner/name "
            "(e.g. lightx2v/Minimax-h3-Turbo), an HF URL, or a local .safetensors file or folder."
        )
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise H3AppError(
            f"{repo_id!r} is not a valid Hub repo id (letters, digits, '-', '_' and '.'; no '--' or '..'; at most "
            "96 characters): use owner/name, e.g. lightx2v/Minimax-h3-Turbo."
        ) from None
    return repo_id


def check_revision(revision: str) -> str:
    """A branch, tag, ``refs/pr/N`` or commit sha; refuses what git would (``..``, ``//``, spaces, ``@{`` …)."""
    if not isinstance(revision, str):
        raise H3AppError(f"revision must be text, got {type(revision).__name__}: use e.g. main or a commit sha.")
    revision = check_length(revision, "revision").strip()
    if (
        len(revision) > 255 or not _REVISION.match(revision) or ".." in revision or "//" in revision
        or revision.endswith(("/", ".", ".lock"))
    ):
        raise H3AppError(
            f"revision {revision!r} is not a valid branch, tag or commit: use a name like main or v1.0, or a "
            "40-character commit sha."
        )
    return revision


def check_weight_name(weight_name: str) -> str:
    """A ``.safetensors`` path inside a repo or folder: forward slashes, relative, no ``..``, not a pickle."""
    if not isinstance(weight_name, str):
        raise H3AppError(f"weight name must be text, got {type(weight_name).__name__}: e.g. model.safetensors.")
    name = check_length(weight_name, "weight name").strip()
    if not name:
        raise H3AppError("weight name is empty: give the .safetensors file's path inside the repo or folder.")
    if _CONTROL.search(name):
        raise H3AppError(
            f"weight name {name!r} contains control characters: give a plain file name such as model.safetensors."
        )
    if "\\" in name:
        raise H3AppError(
            f"weight name {name!r} contains a backslash: use forward slashes for folders inside the repo, "
            "e.g. loras/model.safetensors."
        )
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name) or name.startswith("~"):
        raise H3AppError(
            f"weight name {name!r} is an absolute path: give the file's path inside the repo or folder, "
            "e.g. model.safetensors (or give a local file as SOURCE)."
        )
    parts = name.split("/")
    if any(len(part) > MAX_NAME_PART_CHARS for part in parts):
        raise H3AppError(f"weight name {short(name)} has a file or folder name longer than {MAX_NAME_PART_CHARS} "
                         "characters (the most a file system allows): check the name.")
    if ".." in parts:
        raise H3AppError(
            f"weight name {name!r} contains '..': give a path inside the repo or folder, e.g. loras/model.safetensors."
        )
    if any(part in ("", ".") for part in parts):
        raise H3AppError(
            f"weight name {name!r} has an empty or '.' folder part: give a plain path such as loras/model.safetensors."
        )
    if name.lower().endswith(PICKLE_SUFFIXES):
        raise H3AppError(pickle_message(name))
    if not name.lower().endswith(WEIGHT_SUFFIX):
        raise H3AppError(f"weight name {name!r} does not end in .safetensors: choose the adapter's .safetensors file.")
    return name


def check_folder(folder: str, text: str) -> str:
    """A folder path inside a repo, as a folder URL gives it: relative, forward slashes, no ``..`` or empty part."""
    parts = folder.split("/")
    if any(part in ("", ".", "..") for part in parts) or _CONTROL.search(folder) or "\\" in folder:
        raise H3AppError(f"{text} names the folder {folder!r}, which is not a plain path inside the repo: give the "
                         "file's /resolve/ URL, or the repo id with --weight-name folder/file.safetensors.")
    return folder


def pickle_message(name: str) -> str:
    """The refusal of a pickle file (``.bin``, ``.pt``, …), naming its suffix."""
    suffix = posixpath.splitext(name.replace("\\", "/"))[1]
    return (
        f"{name} is a pickle file ({suffix}): pickles can run code when loaded, so they are refused; choose (or "
        "convert it to) a .safetensors file."
    )
