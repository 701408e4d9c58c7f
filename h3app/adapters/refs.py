"""What ``SOURCE`` names, worked out without any network access: a Hub repo id, an HF URL, a local file or folder.

``SOURCE`` may be
- a Hub model repo id ``owner/name`` (with ``weight_name`` for the file and ``revision`` for branch/tag/commit);
- an HF file URL ``https://huggingface.co/<owner>/<name>/resolve/<rev>/<path>`` or ``…/blob/<rev>/<path>``
  (revision and file taken from it; ``hf.co`` and the configured ``HF_ENDPOINT`` host work too), the repo's
  page ``https://huggingface.co/<owner>/<name>[/tree/<rev>]``, or a folder of it
  ``…/tree/<rev>/<folder>`` (also ``blob/``): ``weight_name`` is then the file's path inside that folder, or
  inside the repo when it already starts with the folder (:func:`folder_weight`);
- a local ``.safetensors`` file (an uploaded file is one), or a local folder holding one or more.

Rules: only ``.safetensors`` (``.bin/.pt/.pth/.ckpt`` are pickles, which run code when loaded: refused); weight
names are paths inside the repo or folder (forward slashes, no ``..``, not absolute); with several safetensors
files and no weight name the caller must choose (``MultipleWeightFiles`` carries the list) — never the first.
Hosted mode (``allowed_local_dirs``): a local path outside the allowed folders is refused before anything else
about it — its existence included — is looked at.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence
from urllib.parse import unquote, urlsplit

from ..errors import H3AppError
from ..rules.units import format_bytes
from ..rules.values import MAX_NAME_PART_CHARS, check_length, short
from .header import PICKLE_SUFFIXES

WEIGHT_SUFFIX = ".safetensors"
HF_HOSTS = ("huggingface.co", "www.huggingface.co", "hf.co")
MAX_NAMES_IN_MESSAGE = 20

LocalPath = str | os.PathLike  # a path given as text or Path

COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
_REVISION = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+\-/]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_REPO_ID_SHAPE = re.compile(r"^[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*$")


@dataclass(frozen=True)
class SourceRef:
    """A parsed ``SOURCE``.

    ``kind`` is ``"hub"`` or ``"local"``. Hub: ``repo_id`` (``owner/name``), ``filename`` (path in the repo, or
    None when still to choose), ``revision`` (None means ``main``), ``folder`` (the repo folder a folder URL
    names: the file is chosen in it; ``nested_filename``: see :func:`folder_weight`). Local: ``local_path`` is the file when ``filename`` is set (``filename`` is
    then its name relative to the folder given, or its base name), else the folder to choose in.
    """

    kind: str
    repo_id: str | None = None
    filename: str | None = None
    revision: str | None = None
    local_path: Path | None = None
    folder: str | None = None
    nested_filename: str | None = None  # a folder URL's weight name that starts with the folder may mean this too

    def describe(self) -> str:
        """``owner/name/file@rev`` or the local path, for messages."""
        if self.kind == "local":
            return str(self.local_path)
        inside = self.filename or self.folder
        text = f"{self.repo_id}/{inside}" if inside else f"{self.repo_id}"
        return f"{text}@{self.revision}" if self.revision else text


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


def parse_source(source: LocalPath, weight_name: str | None = None, revision: str | None = None, *,
                 allowed_local_dirs: Sequence[LocalPath] | None = None) -> SourceRef:
    """Parse ``SOURCE`` (Hub repo id, HF resolve/blob URL, local file or folder) without any network access.

    ``weight_name`` and ``revision`` are validated; a URL's own revision/file must agree with them.
    ``allowed_local_dirs`` (hosted mode): local paths outside these folders (after resolving symlinks) are refused
    first — before the weight name or revision is checked and before anything looks at the path — so the answer
    is the same whether or not such a path exists. Empty strings count as not given.
    """
    if not isinstance(source, (str, os.PathLike)):
        raise H3AppError(f"SOURCE must be text, got {type(source).__name__}: give a Hub repo id, an HF URL or a path.")
    text = check_length(os.fspath(source), "SOURCE").strip()  # first: every later step is at least linear in it
    if any(ord(char) < 32 or ord(char) == 127 for char in text):
        raise H3AppError("SOURCE contains control characters: give a Hub repo id (owner/name), an HF URL or a path.")
    if not text:
        raise H3AppError(
            "SOURCE is empty: give a Hub repo id (owner/name), an HF URL, or a local .safetensors file or folder."
        )
    link = is_url(text)
    path = Path(os.path.abspath(Path(text).expanduser())) if not link else None
    local_looking = not link and _looks_like_local_path(text)
    if allowed_local_dirs is not None and local_looking:
        # First of all, so that the answer is the same whether or not such a path exists (nor what it is).
        check_allowed_local_path(path, allowed_local_dirs, text)
    weight_name = check_weight_name(weight_name) if is_given(weight_name) else None
    revision = check_revision(revision) if is_given(revision) else None
    if link:
        return parse_hf_url(text, weight_name, revision)

    # In hosted mode a repo-id-like text names a local folder only inside the allowed folders: elsewhere it is a
    # repo id, whether or not such a path exists on the server (nothing about the server's files is revealed).
    usable_locally = allowed_local_dirs is None or is_allowed_local_path(path, allowed_local_dirs)
    if usable_locally and path.exists():
        return _local_ref(path, text, weight_name, revision)
    if text.lower().endswith(PICKLE_SUFFIXES):
        raise H3AppError(_pickle_message(text))
    if local_looking and not _clearly_a_path(text):  # e.g. not/a/repo!!: it may have been meant as either
        raise H3AppError(
            f"{text} is neither an existing local path nor a Hub repo id (owner/name in letters, digits, - _ .): "
            "check it, or give an HF URL (https://huggingface.co/…)."
        )
    if local_looking:
        raise H3AppError(
            f"local path {text} does not exist: check the path (a Hub repo id is owner/name; an HF URL starts "
            "with https://huggingface.co/)."
        )
    return SourceRef("hub", repo_id=check_repo_id(text), filename=weight_name, revision=revision)


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
        raise H3AppError(_pickle_message(name))
    if not name.lower().endswith(WEIGHT_SUFFIX):
        raise H3AppError(f"weight name {name!r} does not end in .safetensors: choose the adapter's .safetensors file.")
    return name


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


def _pickle_message(name: str) -> str:
    suffix = posixpath.splitext(name.replace("\\", "/"))[1]
    return (
        f"{name} is a pickle file ({suffix}): pickles can run code when loaded, so they are refused; choose (or "
        "convert it to) a .safetensors file."
    )


def _clearly_a_path(text: str) -> bool:
    """Written as a path (a root, a drive, ./, ~, a backslash or a weight-file suffix), not just slashes."""
    return (text.startswith(("/", "./", "../", "~", ".\\")) or text in (".", "..") or "\\" in text
            or re.match(r"^[A-Za-z]:", text) is not None or text.lower().endswith((WEIGHT_SUFFIX, *PICKLE_SUFFIXES)))


def _looks_like_local_path(text: str) -> bool:
    """True when ``text`` cannot be a Hub repo id, so a missing file should be reported as a missing file."""
    return _clearly_a_path(text) or text.count("/") > 1


def parse_hf_url(text: str, weight_name: str | None, revision: str | None) -> SourceRef:
    from huggingface_hub import constants

    split = urlsplit(text)
    if split.scheme not in ("http", "https"):
        raise H3AppError(
            f"{text}: only http(s) URLs of the Hugging Face Hub are supported; download the file, give its local path."
        )
    endpoint = urlsplit(constants.ENDPOINT)
    endpoint_prefix = endpoint.path.rstrip("/")
    path = split.path
    on_endpoint = split.netloc.lower() == endpoint.netloc.lower()
    if on_endpoint and (not endpoint_prefix or path.startswith(endpoint_prefix + "/")):
        path = path[len(endpoint_prefix):]
    elif (split.hostname or "").lower() not in HF_HOSTS:
        raise H3AppError(
            f"{text} is not a Hugging Face URL (huggingface.co, hf.co or HF_ENDPOINT={constants.ENDPOINT}): "
            "download the file and give its local path, or give the Hub repo id."
        )
    segments = [unquote(s) for s in path.strip("/").split("/")] if path.strip("/") else []
    if segments and segments[0] in ("datasets", "spaces", "buckets", "api", "collections"):
        raise H3AppError(
            f"{text} is not a model repo URL: adapters are read from model repos; give its URL or owner/name."
        )
    if len(segments) < 2:
        raise H3AppError(f"{text} names no repo: use https://huggingface.co/owner/name/resolve/main/file.safetensors.")
    repo_id = check_repo_id(f"{segments[0]}/{segments[1]}")
    url_revision: str | None = None
    url_filename: str | None = None
    url_folder: str | None = None
    rest = segments[2:]
    if rest:
        kind = rest[0]
        if kind not in ("resolve", "blob", "tree") or len(rest) < 2:
            raise H3AppError(
                f"{text} is not a file URL: use …/owner/name/resolve/<revision>/<file>.safetensors (or /blob/), or "
                "the repo id with --weight-name."
            )
        url_revision, path_parts = rest[1], rest[2:]
        if url_revision == "refs" and len(path_parts) >= 2 and path_parts[0] == "pr" and path_parts[1].isdigit():
            url_revision, path_parts = f"refs/pr/{path_parts[1]}", path_parts[2:]
        url_revision = check_revision(url_revision)
        if kind != "tree" and not path_parts:
            raise H3AppError(f"{text} names no file: use …/resolve/<revision>/<file>.safetensors.")
        if path_parts and _names_a_folder(kind, path_parts[-1], weight_name):
            url_folder = check_folder("/".join(path_parts), text)
        elif path_parts:
            url_filename = check_weight_name("/".join(path_parts))
    if weight_name is not None and url_filename is not None and weight_name != url_filename:
        raise H3AppError(f"the URL names {url_filename!r} but --weight-name says {weight_name!r}: drop one of them.")
    if revision is not None and url_revision is not None and revision != url_revision:
        raise H3AppError(f"the URL names revision {url_revision!r} but --revision says {revision!r}: drop one of them.")
    nested = None
    if url_folder is not None and weight_name is not None:
        url_filename, nested = folder_weight(url_folder, weight_name)
    return SourceRef("hub", repo_id=repo_id, filename=url_filename or weight_name, revision=url_revision or revision,
                     folder=url_folder, nested_filename=nested)


def _names_a_folder(kind: str, last: str, weight_name: str | None) -> bool:
    """Whether a URL path ending in ``last`` names a folder: always for ``tree/``; for ``blob/`` and ``resolve/``
    when it is not a file name (no ``.safetensors`` or pickle suffix) and a weight name is given or it has no dot."""
    if kind == "tree":
        return True
    lower = last.lower()
    if lower.endswith((WEIGHT_SUFFIX, *PICKLE_SUFFIXES)):
        return False
    return weight_name is not None or "." not in last


def check_folder(folder: str, text: str) -> str:
    """A folder path inside a repo, as a folder URL gives it: relative, forward slashes, no ``..`` or empty part."""
    parts = folder.split("/")
    if any(part in ("", ".", "..") for part in parts) or _CONTROL.search(folder) or "\\" in folder:
        raise H3AppError(f"{text} names the folder {folder!r}, which is not a plain path inside the repo: give the "
                         "file's /resolve/ URL, or the repo id with --weight-name folder/file.safetensors.")
    return folder


def folder_weight(folder: str, weight_name: str) -> tuple[str, str | None]:
    """The repo path of ``weight_name`` given with a folder URL, and the other path it may mean: ``folder/name``;
    or, for a name that already starts with ``folder/``, the name itself, which may also mean ``folder/name`` (a
    same-named subfolder; ``hub.resolve_folder_weight`` settles that against the repo's files)."""
    if weight_name.startswith(folder + "/"):
        return weight_name, f"{folder}/{weight_name}"
    return f"{folder}/{weight_name}", None


def _local_ref(path: Path, text: str, weight_name: str | None, revision: str | None) -> SourceRef:
    if revision is not None:
        raise H3AppError(f"--revision applies to Hub sources, but {text} is a local path: drop --revision.")
    if path.is_file():
        if path.name.lower().endswith(PICKLE_SUFFIXES):
            raise H3AppError(_pickle_message(path.name))
        if not path.name.lower().endswith(WEIGHT_SUFFIX):
            raise H3AppError(f"{path} is not a .safetensors file: give the adapter's .safetensors file.")
        if weight_name is not None and weight_name != path.name:
            raise H3AppError(
                f"{path} is already a file, but --weight-name says {weight_name!r}: drop --weight-name, or give "
                "the folder as SOURCE."
            )
        return SourceRef("local", filename=path.name, local_path=path)
    if path.is_dir():
        if weight_name is None:
            return SourceRef("local", local_path=path)
        file = path.joinpath(*weight_name.split("/"))
        if not file.is_file():
            choose_weight(list_local(path), weight_name, where=f"folder {path}")  # raises, listing what is there
        return SourceRef("local", filename=weight_name, local_path=file)
    raise H3AppError(f"{path} is neither a file nor a folder: give a .safetensors file or a folder holding one.")


def as_ref(source: LocalPath | SourceRef, weight_name: str | None, revision: str | None,
            allowed_local_dirs: Sequence[LocalPath] | None) -> SourceRef:
    if isinstance(source, SourceRef):
        if weight_name is not None or revision is not None:
            raise ValueError("pass weight_name/revision to parse_source, not with a SourceRef")
        if source.kind == "local" and allowed_local_dirs is not None:
            check_allowed_local_path(source.local_path, allowed_local_dirs)
        return source
    return parse_source(source, weight_name, revision, allowed_local_dirs=allowed_local_dirs)


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


def implied_weight(source: LocalPath, weight_name: str | None, *,
                   allowed_local_dirs: Sequence[LocalPath] | None = None) -> str | None:
    """The weight name to pass along with ``source``, or None when the source already names exactly that file: a
    local file of that name, or a local folder whose only ``.safetensors`` file it is — listed as
    :func:`list_weight_files` lists a folder (recursive, any case of the suffix, hidden folders skipped).

    Hosted mode (``allowed_local_dirs``): a path outside the allowed folders is never looked at; the name passes
    through and :func:`parse_source` refuses the path, so an existing and a missing path get the same answer.
    """
    if not is_given(weight_name):
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


def local_weight(ref: SourceRef, allowed_local_dirs: Sequence[LocalPath] | None) -> tuple[Path, str]:
    """(file, name relative to the folder given) for a local source, choosing in a folder when needed."""
    if ref.filename is not None:
        path, name = ref.local_path, ref.filename
    else:
        chosen = choose_weight(list_local(ref.local_path), None, where=f"folder {ref.local_path}")
        path, name = ref.local_path.joinpath(*chosen.name.split("/")), chosen.name
    if allowed_local_dirs is not None:
        check_allowed_local_path(path, allowed_local_dirs)
    if not path.is_file():
        raise H3AppError(f"{path} does not exist: check the path.")
    return path, name
