"""Where an adapter file comes from: a Hub repo id, an HF URL, a local file or folder → a local file, pinned.

``SOURCE`` may be
- a Hub model repo id ``owner/name`` (with ``weight_name`` for the file and ``revision`` for branch/tag/commit);
- an HF file URL ``https://huggingface.co/<owner>/<name>/resolve/<rev>/<path>`` or ``…/blob/<rev>/<path>``
  (revision and file taken from it; ``hf.co`` and the configured ``HF_ENDPOINT`` host work too), or the repo's
  page ``https://huggingface.co/<owner>/<name>[/tree/<rev>]``;
- a local ``.safetensors`` file (an uploaded file is one), or a local folder holding one or more.

Rules: only ``.safetensors`` (``.bin/.pt/.pth/.ckpt`` are pickles, which run code when loaded: refused); weight
names are paths inside the repo or folder (forward slashes, no ``..``, not absolute); with several safetensors
files and no weight name the caller must choose (``MultipleWeightFiles`` carries the list) — never the first.

Hub access goes through huggingface_hub, so ``HF_ENDPOINT``, ``HF_HOME``/``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` and
``HF_TOKEN`` behave as everywhere else (huggingface_hub reads the first three at import; this module reads its
``constants`` at call time). ``read_header`` reads the header and the 0-dim scalars (``.alpha``) with HTTP Range
requests, so format, rank and alpha show before a multi-GB download; ``fetch`` downloads only the chosen file and
the small ``*.json`` sidecars in its folder (``adapter_config.json``), into the huggingface_hub cache, pinned to
the commit it came from. Every failure is one ``H3AppError`` line naming the repo and file.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import os
import posixpath
import re
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence
from urllib.parse import unquote, urlsplit

from ..errors import H3AppError
from ..rules.units import format_bytes
from .header import (ADAPTER_CONFIG_NAME, PICKLE_SUFFIXES, make_header_view, parse_header, read_adapter_config,
                     read_local_header, read_scalars)
from .types import HeaderView

WEIGHT_SUFFIX = ".safetensors"
HF_HOSTS = ("huggingface.co", "www.huggingface.co", "hf.co")
SIDECAR_SUFFIX = ".json"
SIDECAR_MAX_BYTES = 1_000_000  # a sidecar larger than this is not an adapter config: not downloaded
SCALAR_SPAN_GAP = 64 * 1024  # scalars closer than this (bytes) are read in one Range request
RANGE_READ_WORKERS = 8  # concurrent Range requests when scalars are spread over the file
MAX_NAMES_IN_MESSAGE = 20

ProgressCallback = Callable[[int, "int | None"], None]
LocalPath = str | os.PathLike  # a path given as text or Path
Token = str | bool | None  # a token; None: HF_TOKEN or the saved login; False: none at all

_COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
_REVISION = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+\-/]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# ---------------------------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceRef:
    """A parsed ``SOURCE``.

    ``kind`` is ``"hub"`` or ``"local"``. Hub: ``repo_id`` (``owner/name``), ``filename`` (path in the repo, or
    None when still to choose), ``revision`` (None means ``main``). Local: ``local_path`` is the file when
    ``filename`` is set (``filename`` is then its name relative to the folder given, or its base name), else the
    folder to choose in.
    """

    kind: str
    repo_id: str | None = None
    filename: str | None = None
    revision: str | None = None
    local_path: Path | None = None

    def describe(self) -> str:
        """``owner/name/file@rev`` or the local path, for messages."""
        if self.kind == "local":
            return str(self.local_path)
        text = f"{self.repo_id}/{self.filename}" if self.filename else f"{self.repo_id}"
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


@functools.lru_cache(maxsize=256)
def file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """Hex sha256 of ``path``; ``size`` and ``mtime_ns`` are part of the cache key, so a rewritten file is hashed
    again. Every job names its adapter file again, and a 1.3 GB Turbo file takes seconds to hash."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


@dataclass(frozen=True)
class AdapterFile:
    """A local copy of an adapter file and where it came from.

    ``path`` is the local file (for Hub files: in the huggingface_hub cache, ``snapshots/<commit>/<filename>``);
    ``adapter_config_path`` is ``adapter_config.json`` beside it (or None); ``sidecar_paths`` every ``*.json``
    sidecar fetched beside it. Hub files have ``repo_id``, ``revision`` (as asked; ``main`` by default) and
    ``commit`` (the resolved 40-hex sha the bytes came from); local files have None there. ``size`` in bytes.
    """

    path: Path
    adapter_config_path: Path | None
    repo_id: str | None
    revision: str | None
    commit: str | None
    filename: str
    size: int
    sidecar_paths: tuple[Path, ...] = ()
    _digest: dict = field(default_factory=dict, repr=False, compare=False, hash=False)

    def sha256(self) -> str:
        """Hex sha256 of the file's bytes, streamed once per file version (path, size, mtime) in this process."""
        if "sha256" not in self._digest:
            stat = self.path.stat()
            self._digest["sha256"] = file_sha256(str(self.path.resolve()), stat.st_size, stat.st_mtime_ns)
        return self._digest["sha256"]

    def __fspath__(self) -> str:
        """``Path(adapter_file)`` / ``open(adapter_file)`` use the local file."""
        return os.fspath(self.path)

    def describe(self) -> str:
        if self.repo_id is None:
            return str(self.path)
        return f"{self.repo_id}/{self.filename}@{(self.commit or self.revision or 'main')[:12]}"


def describe_files(files: Sequence[WeightFile]) -> str:
    """``a.safetensors (1.2 MB), b.safetensors (300 B)``, at most ``MAX_NAMES_IN_MESSAGE`` names."""
    shown = ", ".join(f.describe() for f in files[:MAX_NAMES_IN_MESSAGE])
    more = len(files) - MAX_NAMES_IN_MESSAGE
    return f"{shown}, … and {more} more" if more > 0 else shown


# ---------------------------------------------------------------------------------------------------------------
# Parsing and validation
# ---------------------------------------------------------------------------------------------------------------
def parse_source(source: LocalPath, weight_name: str | None = None, revision: str | None = None, *,
                 allowed_local_dirs: Sequence[LocalPath] | None = None) -> SourceRef:
    """Parse ``SOURCE`` (Hub repo id, HF resolve/blob URL, local file or folder) without any network access.

    ``weight_name`` and ``revision`` are validated; a URL's own revision/file must agree with them.
    ``allowed_local_dirs`` (hosted mode): local paths outside these folders (after resolving symlinks) are refused
    before anything about them is revealed. Empty strings count as not given.
    """
    if not isinstance(source, (str, os.PathLike)):
        raise H3AppError(f"SOURCE must be text, got {type(source).__name__}: give a Hub repo id, an HF URL or a path.")
    text = os.fspath(source).strip()
    if any(ord(char) < 32 or ord(char) == 127 for char in text):
        raise H3AppError("SOURCE contains control characters: give a Hub repo id (owner/name), an HF URL or a path.")
    if not text:
        raise H3AppError(
            "SOURCE is empty: give a Hub repo id (owner/name), an HF URL, or a local .safetensors file or folder."
        )
    weight_name = check_weight_name(weight_name) if _given(weight_name) else None
    revision = check_revision(revision) if _given(revision) else None

    if re.match(r"^[A-Za-z][A-Za-z0-9+.\-]*://", text):
        return _parse_url(text, weight_name, revision)

    path = Path(os.path.abspath(Path(text).expanduser()))
    local_looking = _looks_like_local_path(text)
    if allowed_local_dirs is not None and local_looking:
        check_allowed_local_path(path, allowed_local_dirs)
    # In hosted mode a repo-id-like text names a local folder only inside the allowed folders: elsewhere it is a
    # repo id, whether or not such a path exists on the server (nothing about the server's files is revealed).
    usable_locally = allowed_local_dirs is None or is_allowed_local_path(path, allowed_local_dirs)
    if usable_locally and path.exists():
        return _local_ref(path, text, weight_name, revision)
    if text.lower().endswith(PICKLE_SUFFIXES):
        raise H3AppError(_pickle_message(text))
    if local_looking:
        raise H3AppError(
            f"local path {text} does not exist: check the path (a Hub repo id is owner/name; an HF URL starts "
            "with https://huggingface.co/)."
        )
    return SourceRef("hub", repo_id=check_repo_id(text), filename=weight_name, revision=revision)


def _given(value: object) -> bool:
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
    revision = revision.strip()
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
    name = weight_name.strip()
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
    """Whether ``path``, symlinks resolved, is one of ``allowed_local_dirs`` or inside one."""
    real = Path(os.path.realpath(path))
    for folder in allowed_local_dirs:
        base = Path(os.path.realpath(folder))
        if real == base or base in real.parents:
            return True
    return False


def check_allowed_local_path(path: LocalPath, allowed_local_dirs: Sequence[LocalPath]) -> None:
    """Hosted mode: refuse a local path that, symlinks resolved, is not inside one of ``allowed_local_dirs``."""
    if is_allowed_local_path(path, allowed_local_dirs):
        return
    raise H3AppError(
        f"local path {os.fspath(path)} is not allowed on this server (only uploaded files and its own adapter "
        "folders are): upload the file, or give a Hub repo id or URL."
    )


def _pickle_message(name: str) -> str:
    suffix = posixpath.splitext(name.replace("\\", "/"))[1]
    return (
        f"{name} is a pickle file ({suffix}): pickles can run code when loaded, so they are refused; choose (or "
        "convert it to) a .safetensors file."
    )


def _looks_like_local_path(text: str) -> bool:
    """True when ``text`` cannot be a Hub repo id, so a missing file should be reported as a missing file."""
    return (
        text.startswith(("/", "./", "../", "~", ".\\")) or text in (".", "..") or "\\" in text
        or re.match(r"^[A-Za-z]:", text) is not None or text.count("/") > 1
        or text.lower().endswith((WEIGHT_SUFFIX, *PICKLE_SUFFIXES))
    )


def _parse_url(text: str, weight_name: str | None, revision: str | None) -> SourceRef:
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
        if kind == "tree":
            if path_parts:
                raise H3AppError(
                    f"{text} is a folder URL: give the file's /resolve/ or /blob/ URL, or the repo id with "
                    "--weight-name folder/file.safetensors."
                )
        elif not path_parts:
            raise H3AppError(f"{text} names no file: use …/resolve/<revision>/<file>.safetensors.")
        else:
            url_filename = check_weight_name("/".join(path_parts))
    if weight_name is not None and url_filename is not None and weight_name != url_filename:
        raise H3AppError(f"the URL names {url_filename!r} but --weight-name says {weight_name!r}: drop one of them.")
    if revision is not None and url_revision is not None and revision != url_revision:
        raise H3AppError(f"the URL names revision {url_revision!r} but --revision says {revision!r}: drop one of them.")
    return SourceRef("hub", repo_id=repo_id, filename=url_filename or weight_name, revision=url_revision or revision)


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
            choose_weight(_list_local(path), weight_name, where=f"folder {path}")  # raises, listing what is there
        return SourceRef("local", filename=weight_name, local_path=file)
    raise H3AppError(f"{path} is neither a file nor a folder: give a .safetensors file or a folder holding one.")


def _as_ref(source: LocalPath | SourceRef, weight_name: str | None, revision: str | None,
            allowed_local_dirs: Sequence[LocalPath] | None) -> SourceRef:
    if isinstance(source, SourceRef):
        if weight_name is not None or revision is not None:
            raise ValueError("pass weight_name/revision to parse_source, not with a SourceRef")
        if source.kind == "local" and allowed_local_dirs is not None:
            check_allowed_local_path(source.local_path, allowed_local_dirs)
        return source
    return parse_source(source, weight_name, revision, allowed_local_dirs=allowed_local_dirs)


# ---------------------------------------------------------------------------------------------------------------
# Listing and choosing
# ---------------------------------------------------------------------------------------------------------------
def list_weight_files(source: LocalPath | SourceRef, revision: str | None = None, token: Token = None,
                      *, allowed_local_dirs: Sequence[LocalPath] | None = None,
                      cache_dir: LocalPath | None = None) -> list[WeightFile]:
    """The ``.safetensors`` files (name, size in bytes) of a Hub repo at ``revision``, a folder, or a file.

    Hub: one ``model_info(files_metadata=True)`` call. Offline (``HF_HUB_OFFLINE=1``): what the local cache holds
    for that revision.
    """
    ref = _as_ref(source, None, revision, allowed_local_dirs)
    if ref.kind == "local":
        if ref.filename is not None:
            return [WeightFile(ref.filename, ref.local_path.stat().st_size)]
        return _list_local(ref.local_path)
    return _hub_listing(ref, _clean_token(token), cache_dir).weights


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


def _list_local(folder: Path) -> list[WeightFile]:
    """``.safetensors`` files under ``folder`` (hidden folders such as ``.git`` skipped), sorted by path."""
    found: list[WeightFile] = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.lower().endswith(WEIGHT_SUFFIX) and not name.startswith("."):
                path = Path(root, name)
                found.append(WeightFile(path.relative_to(folder).as_posix(), path.stat().st_size))
    return sorted(found, key=lambda f: f.name)


def _local_weight(ref: SourceRef, allowed_local_dirs: Sequence[LocalPath] | None) -> tuple[Path, str]:
    """(file, name relative to the folder given) for a local source, choosing in a folder when needed."""
    if ref.filename is not None:
        path, name = ref.local_path, ref.filename
    else:
        chosen = choose_weight(_list_local(ref.local_path), None, where=f"folder {ref.local_path}")
        path, name = ref.local_path.joinpath(*chosen.name.split("/")), chosen.name
    if allowed_local_dirs is not None:
        check_allowed_local_path(path, allowed_local_dirs)
    if not path.is_file():
        raise H3AppError(f"{path} does not exist: check the path.")
    return path, name


@dataclass(frozen=True)
class _HubListing:
    """Every file of a repo at one commit (name → size in bytes), from the Hub or from the local cache."""

    commit: str | None
    files: Mapping[str, int | None]
    snapshot: Path | None = None  # set when read from the local cache (offline)

    @property
    def weights(self) -> list[WeightFile]:
        return sorted((WeightFile(n, s) for n, s in self.files.items() if n.lower().endswith(WEIGHT_SUFFIX)),
                      key=lambda f: f.name)

    def sidecars(self, weight_name: str) -> list[str]:
        """Small ``*.json`` files in the same folder of the repo as ``weight_name``."""
        folder = posixpath.dirname(weight_name)
        return sorted(
            name for name, size in self.files.items()
            if name.lower().endswith(SIDECAR_SUFFIX) and posixpath.dirname(name) == folder
            and (size is None or size <= SIDECAR_MAX_BYTES)
        )


def _hub_listing(ref: SourceRef, token: Token, cache_dir: LocalPath | None) -> _HubListing:
    from huggingface_hub import HfApi, constants

    if constants.is_offline_mode():
        return _cached_listing(ref, cache_dir)
    with _hub_errors(ref):
        info = HfApi().model_info(ref.repo_id, revision=ref.revision, files_metadata=True, token=token)
    return _HubListing(info.sha, {s.rfilename: s.size for s in info.siblings or []})


def _cached_listing(ref: SourceRef, cache_dir: LocalPath | None) -> _HubListing:
    """The files of ``ref``'s revision that the huggingface_hub cache holds (``refs/<rev>`` → ``snapshots/<sha>``)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    storage = Path(cache_dir or constants.HF_HUB_CACHE) / repo_folder_name(repo_id=ref.repo_id, repo_type="model")
    revision = ref.revision or "main"
    commit: str | None = revision if _COMMIT_SHA.match(revision) else None
    ref_file = storage / "refs" / revision
    if commit is None and ref_file.is_file():
        commit = ref_file.read_text().strip()
    snapshot = storage / "snapshots" / commit if commit else None
    if snapshot is None or not snapshot.is_dir():
        raise _offline_error(ref, ref.filename)
    files = {
        path.relative_to(snapshot).as_posix(): path.stat().st_size
        for path in sorted(snapshot.rglob("*")) if path.is_file()
    }
    return _HubListing(commit, files, snapshot=snapshot)


def _hub_where(ref: SourceRef) -> str:
    return f"Hub repo {ref.repo_id}" + (f" at revision {ref.revision}" if ref.revision else "")


def _choose_hub_weight(ref: SourceRef, listing: _HubListing) -> WeightFile:
    if listing.snapshot is not None and ref.filename is not None and ref.filename not in listing.files:
        raise _offline_error(ref, ref.filename)
    if listing.snapshot is not None and not listing.weights:
        raise _offline_error(ref, None)
    return choose_weight(listing.weights, ref.filename, where=_hub_where(ref))


# ---------------------------------------------------------------------------------------------------------------
# Header preview (no weights)
# ---------------------------------------------------------------------------------------------------------------
def read_header(source: LocalPath | SourceRef, weight_name: str | None = None, revision: str | None = None,
                token: Token = None, *, allowed_local_dirs: Sequence[LocalPath] | None = None,
                cache_dir: LocalPath | None = None) -> HeaderView:
    """The adapter's header and 0-dim scalars, without reading (or downloading) any weight tensor.

    Local: ``read_local_header``. Hub (online): ``model_info`` pins the commit and the size; the header comes from
    ``parse_safetensors_file_metadata`` (Range reads of the first ≤100 kB) and is checked with the same rules as a
    local header; the scalars (0-dim tensors and single-element ``.alpha``, as the local reader decodes them) come
    from HTTP Range reads of a few bytes, neighbours merged into one request (plus 8 bytes for the header length,
    to locate the data); and
    ``adapter_config.json`` from the same folder of the repo, if it exists, is downloaded (it is small). Offline:
    the cached file, read locally.
    """
    ref = _as_ref(source, weight_name, revision, allowed_local_dirs)
    if ref.kind == "local":
        path, _ = _local_weight(ref, allowed_local_dirs)
        return read_local_header(path)
    token = _clean_token(token)
    listing = _hub_listing(ref, token, cache_dir)
    weight = _choose_hub_weight(ref, listing)
    if listing.snapshot is not None:
        return read_local_header(listing.snapshot.joinpath(*weight.name.split("/")))
    return _read_remote_header(ref, weight, listing, token, cache_dir)


def _read_remote_header(ref: SourceRef, weight: WeightFile, listing: _HubListing, token: Token,
                        cache_dir: LocalPath | None) -> HeaderView:
    from huggingface_hub import HfApi, hf_hub_download, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    pinned = listing.commit or ref.revision
    name = posixpath.basename(weight.name)
    where = f"{ref.repo_id}/{weight.name}"
    with _hub_errors(ref, weight.name):
        remote = HfApi().parse_safetensors_file_metadata(ref.repo_id, weight.name, revision=pinned, token=token)
        # The same validation as a local header (known dtypes, offsets tiling the data exactly), on the header
        # huggingface_hub parsed: an impostor or damaged file is refused before any scalar is read.
        tensors, metadata, buffer_end = parse_header(_header_json(remote), name)
        url = hf_hub_url(ref.repo_id, weight.name, revision=pinned)
        headers = build_hf_headers(token=token)
        scalars, file_bytes = _read_remote_scalars(url, headers, tensors, buffer_end, weight.size, where)

    adapter_config = None
    config_name = posixpath.join(posixpath.dirname(weight.name), ADAPTER_CONFIG_NAME).lstrip("/")
    if config_name in listing.files:
        config_size = listing.files[config_name]
        if config_size is not None and config_size > SIDECAR_MAX_BYTES:
            raise H3AppError(
                f"{ref.repo_id}/{config_name} is {format_bytes(config_size)}, far too large for an adapter config "
                f"(limit {format_bytes(SIDECAR_MAX_BYTES)}): fix the repo, or download the file and inspect it locally."
            )
        with _hub_errors(ref, config_name):
            config_path = hf_hub_download(ref.repo_id, config_name, revision=pinned, token=token, cache_dir=cache_dir)
        adapter_config = read_adapter_config(config_path)
    return make_header_view(tensors, metadata, scalars, adapter_config, file_bytes, name)


def _header_json(remote: Any) -> bytes:
    """huggingface_hub's ``SafetensorsFileMetadata`` back to safetensors header JSON, for ``parse_header``."""
    header: dict[str, Any] = {"__metadata__": dict(remote.metadata or {})}
    for key, info in remote.tensors.items():
        header[key] = {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": list(info.data_offsets)}
    return json.dumps(header).encode("utf-8")


def _read_remote_scalars(url: str, headers: Mapping[str, str],
                         tensors: Mapping[str, tuple[str, tuple[int, ...], tuple[int, int]]], buffer_end: int,
                         size: int | None, where: str) -> tuple[dict[str, float], int]:
    """Decode the single-element tensors with Range reads; returns (scalars, file size in bytes).

    The data section starts at ``8 + header length``; for a well-formed file that is ``size - buffer_end``, so the
    8-byte length prefix is read together with the scalars (neighbouring spans, the prefix included, merged into
    one request when less than ``SCALAR_SPAN_GAP`` apart; the rest in parallel) and must agree, else the file is
    damaged and refused.
    """

    def get(start: int, end_inclusive: int) -> bytes:
        return _range_get(url, headers, start, end_inclusive, where)

    scalar_spans = sorted(span for (_, shape, span) in tensors.values() if math.prod(shape) == 1 and span[1] > span[0])
    prefetched: dict[int, bytes] = {}
    if size is None:
        prefetched[0] = get(0, 7)
        data_start = 8 + int.from_bytes(prefetched[0], "little")
        size = data_start + buffer_end
        wanted: list[tuple[int, int]] = []
    else:
        if size < 8 + buffer_end:
            raise H3AppError(
                f"{where} is truncated: the Hub says {size:,} bytes but its header needs ≥ {8 + buffer_end:,}: "
                "fix the upload or pick another file."
            )
        if not scalar_spans:
            return {}, size
        data_start = size - buffer_end
        wanted = [(0, 8)]
    wanted += [(data_start + begin, data_start + end) for begin, end in scalar_spans]

    merged: list[list[int]] = []
    for begin, end in sorted(wanted):
        if merged and begin - merged[-1][1] <= SCALAR_SPAN_GAP:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([begin, end])
    if len(merged) <= 1:
        chunks = [get(begin, end - 1) for begin, end in merged]
    else:
        with ThreadPoolExecutor(max_workers=min(RANGE_READ_WORKERS, len(merged))) as pool:
            chunks = list(pool.map(lambda span: get(span[0], span[1] - 1), merged))
    prefetched.update({begin: data for (begin, _), data in zip(merged, chunks)})
    reader = _SpanReader(prefetched, get)

    reader.seek(0)
    declared = 8 + int.from_bytes(reader.read(8), "little") + buffer_end
    if declared != size:
        problem = ("is truncated" if size < declared
                   else f"has {size - declared:,} bytes after the end its header declares")
        raise H3AppError(
            f"{where} {problem} (the Hub says {size:,} bytes, its header {declared:,}): not a valid safetensors "
            "file; fix the upload or pick another file."
        )
    return read_scalars(reader, data_start, tensors), size


class _SpanReader:
    """A read-only file-like view of a remote file of which only some byte spans were fetched."""

    def __init__(self, chunks: dict[int, bytes], fetch: Callable[[int, int], bytes]) -> None:
        self._chunks = chunks
        self._fetch = fetch
        self._position = 0

    def seek(self, position: int, whence: int = 0) -> int:
        if whence != 0:
            raise ValueError("only absolute seeks")
        self._position = position
        return position

    def read(self, count: int) -> bytes:
        start, stop = self._position, self._position + count
        for chunk_start, data in self._chunks.items():
            if chunk_start <= start and stop <= chunk_start + len(data):
                self._position = stop
                return data[start - chunk_start:stop - chunk_start]
        data = self._fetch(start, stop - 1)  # not prefetched: read it on its own
        self._chunks[start] = data
        self._position = stop
        return data


def _range_get(url: str, headers: Mapping[str, str], start: int, end: int, where: str) -> bytes:
    """Bytes ``start..end`` (inclusive) of a Hub file, through huggingface_hub's session (auth, offline switch)."""
    from huggingface_hub import get_session
    from huggingface_hub.utils import hf_raise_for_status

    wanted = end - start + 1
    with get_session().stream("GET", url, headers={**headers, "Range": f"bytes={start}-{end}"}) as response:
        if response.status_code >= 400:
            response.read()
            hf_raise_for_status(response)
        if response.status_code == 206:
            data = response.read()
        else:  # the server ignored Range: take what we need from the stream and drop the rest unread
            buffer = bytearray()
            for piece in response.iter_bytes():
                buffer += piece
                if len(buffer) > end:
                    break
            data = bytes(buffer[start:end + 1])
    if len(data) != wanted:
        raise H3AppError(
            f"{where}: a {wanted}-byte range read returned {len(data)} bytes: the file is shorter than its header "
            "says; fix the upload or pick another file."
        )
    return data


# ---------------------------------------------------------------------------------------------------------------
# Fetch (download, pinned)
# ---------------------------------------------------------------------------------------------------------------
def fetch(source: LocalPath | SourceRef, weight_name: str | None = None, revision: str | None = None,
          token: Token = None, progress: ProgressCallback | None = None, max_bytes: int | None = None,
          allowed_local_dirs: Sequence[LocalPath] | None = None, *,
          cache_dir: LocalPath | None = None) -> AdapterFile:
    """A local copy of the adapter file, plus its ``*.json`` sidecars, pinned to the commit it came from.

    Hub: ``model_info`` lists the repo (commit, sizes); the file is chosen (``choose_weight``); ``max_bytes``
    (hosted mode) is checked against the listed size before downloading and against the file after; then
    ``hf_hub_download`` fetches only that file and the ``*.json`` files (≤ ``SIDECAR_MAX_BYTES``) in its folder,
    into the huggingface_hub cache (``HF_HOME``/``cache_dir``). Interrupted downloads leave nothing behind
    (huggingface_hub writes to a unique ``.incomplete`` file and renames it only when complete). Offline: from
    the cache, or a clear error.

    ``progress(done_bytes, total_bytes)`` is called as the weight file downloads (via huggingface_hub's
    ``tqdm_class`` hook; ``total_bytes`` may be None) and once at the end with ``(size, size)``, also when
    nothing had to be downloaded. Raising from it aborts the download (nothing partial is kept).

    Local: the file (chosen in a folder as above), ``adapter_config.json`` beside it. ``allowed_local_dirs``
    (hosted mode): local paths outside these folders, symlinks resolved, are refused; ``max_bytes`` applies too.

    ``token``: a Hub token string; None → ``HF_TOKEN`` or the saved login (huggingface_hub's default); False → no
    token at all (hosted mode, unless the visitor pasted one: the server's own token must not read for visitors).
    """
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0):
        raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
    ref = _as_ref(source, weight_name, revision, allowed_local_dirs)
    if ref.kind == "local":
        path, name = _local_weight(ref, allowed_local_dirs)
        size = path.stat().st_size
        _check_size(size, max_bytes, str(path))
        if progress is not None:
            progress(size, size)
        sidecars = tuple(sorted(p for p in path.parent.glob("*" + SIDECAR_SUFFIX) if p.is_file()))
        config = path.with_name(ADAPTER_CONFIG_NAME)
        return AdapterFile(path=path, adapter_config_path=config if config.is_file() else None, repo_id=None,
                           revision=None, commit=None, filename=name, size=size, sidecar_paths=sidecars)

    token = _clean_token(token)
    listing = _hub_listing(ref, token, cache_dir)
    weight = _choose_hub_weight(ref, listing)
    where = f"{ref.repo_id}/{weight.name}"
    if listing.snapshot is not None:
        path = listing.snapshot.joinpath(*weight.name.split("/"))
        commit = listing.commit
        sidecar_names = listing.sidecars(weight.name)
    else:
        if max_bytes is not None:
            _check_size(weight.size if weight.size is not None else _remote_size(ref, weight.name, token),
                        max_bytes, where)
        path, commit = _download_pinned(ref, weight.name, listing, token, cache_dir, progress)
        sidecar_names = listing.sidecars(weight.name)
        for sidecar in sidecar_names:
            _download_sidecar(ref, sidecar, commit, token, cache_dir)
    size = path.stat().st_size
    _check_size(size, max_bytes, where)
    if progress is not None:
        progress(size, size)
    sidecars = tuple(p for p in (path.parent / posixpath.basename(n) for n in sidecar_names) if p.is_file())
    config = path.with_name(ADAPTER_CONFIG_NAME)
    return AdapterFile(path=path, adapter_config_path=config if config.is_file() else None, repo_id=ref.repo_id,
                       revision=ref.revision or "main", commit=commit, filename=weight.name, size=size,
                       sidecar_paths=sidecars)


def check_access(repo_id: str, filename: str, revision: str | None = None, token: Token = None) -> None:
    """Ask the Hub (a HEAD with ``token``) whether this caller may read ``repo_id/filename``; the one-line gated /
    not-found errors otherwise. A cached copy proves nothing about *this* caller's access (hosted mode serves many
    visitors from one cache). Offline there is nobody to ask: the check is skipped."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

    if constants.HF_HUB_OFFLINE:
        return
    ref = SourceRef(kind="hub", repo_id=repo_id, filename=filename, revision=revision)
    with _hub_errors(ref, filename):
        get_hf_file_metadata(hf_hub_url(repo_id, filename, revision=revision), token=token)


def _download_pinned(ref: SourceRef, filename: str, listing: _HubListing, token: Token,
                     cache_dir: LocalPath | None,
                     progress: ProgressCallback | None) -> tuple[Path, str | None]:
    """Download by the revision asked (so the cache records ``refs/<rev>`` for offline use); the commit the bytes
    came from is the snapshot folder huggingface_hub put them in."""
    from huggingface_hub import hf_hub_download

    with _hub_errors(ref, filename):
        path = Path(hf_hub_download(
            ref.repo_id, filename, revision=ref.revision, token=token, cache_dir=cache_dir,
            tqdm_class=_progress_relay(progress) if progress is not None else None,
        ))
    depth = len(filename.split("/"))
    parts = path.parts
    commit = parts[-depth - 1] if len(parts) > depth + 1 and parts[-depth - 2] == "snapshots" else None
    return path, commit if commit and _COMMIT_SHA.match(commit) else listing.commit


def _download_sidecar(ref: SourceRef, name: str, commit: str | None, token: Token,
                      cache_dir: LocalPath | None) -> None:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import RemoteEntryNotFoundError

    with _hub_errors(ref, name):
        try:
            hf_hub_download(ref.repo_id, name, revision=commit or ref.revision, token=token, cache_dir=cache_dir)
        except RemoteEntryNotFoundError:
            return  # listed a moment ago, gone at that commit: a sidecar is optional


def _remote_size(ref: SourceRef, filename: str, token: Token) -> int | None:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    with _hub_errors(ref, filename):
        return get_hf_file_metadata(hf_hub_url(ref.repo_id, filename, revision=ref.revision), token=token).size


def _check_size(size: int | None, max_bytes: int | None, where: str) -> None:
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


def _progress_relay(progress: ProgressCallback) -> type:
    """A tqdm class for huggingface_hub's ``tqdm_class`` hook that reports bytes to ``progress`` and prints nothing."""
    from tqdm import tqdm

    class ProgressRelay(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("name", None)
            kwargs["file"] = io.StringIO()  # the callback is the display
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            result = super().update(n)
            progress(int(self.n), int(self.total) if self.total else None)
            return result

    return ProgressRelay


def _clean_token(token: Token) -> str | bool | None:
    """None or an empty pasted token: huggingface_hub's default (``HF_TOKEN``, else the saved login).
    ``False``: send no token at all (hosted mode, so the server's own token never serves a visitor)."""
    if token is None or token is False:
        return token
    if token is True:
        raise ValueError("token=True is not supported: pass a token string, None (default) or False (none)")
    token = token.strip()
    return token or None


# ---------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------
def _offline_error(ref: SourceRef, filename: str | None) -> H3AppError:
    what = f"{ref.repo_id}/{filename}" if filename else f"Hub repo {ref.repo_id}"
    at = f" (revision {ref.revision})" if ref.revision else ""
    return H3AppError(
        f"{what}{at} is not in the local cache and HF_HUB_OFFLINE=1: unset HF_HUB_OFFLINE to download it, or "
        "fetch it once while online."
    )


def _token_was_sent(error: Exception) -> bool:
    response = getattr(error, "response", None)
    request = getattr(response, "request", None) if response is not None else None
    return request is not None and request.headers.get("authorization") is not None


@contextmanager
def _hub_errors(ref: SourceRef, filename: str | None = None) -> Iterator[None]:
    """Turn huggingface_hub / HTTP failures into one ``H3AppError`` line naming the repo and file."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
        SafetensorsParsingError,
    )

    what = f"{ref.repo_id}/{filename}" if filename else f"Hub repo {ref.repo_id}"
    at = f" at revision {ref.revision}" if ref.revision else ""
    page = f"{constants.ENDPOINT}/{ref.repo_id}"
    try:
        yield
    except H3AppError:
        raise
    except OfflineModeIsEnabled:
        raise _offline_error(ref, filename) from None
    except LocalEntryNotFoundError:
        if constants.is_offline_mode():
            raise _offline_error(ref, filename) from None
        raise H3AppError(
            f"could not reach the Hub at {constants.ENDPOINT} for {what}{at}, and it is not in the local cache: "
            "check the network connection (or HF_ENDPOINT) and retry."
        ) from None
    except GatedRepoError as error:
        if _token_was_sent(error):
            raise H3AppError(
                f"Hub repo {ref.repo_id} is gated and the token given has no access to {what}: accept the repo's "
                f"terms at {page} with that account, or use another token."
            ) from None
        raise H3AppError(
            f"Hub repo {ref.repo_id} is gated and no token was given for {what}: accept its terms at {page}, then "
            "set HF_TOKEN or paste a token."
        ) from None
    except RepositoryNotFoundError:
        raise H3AppError(
            f"Hub repo {ref.repo_id} was not found (or it is private and no valid token was given): check the repo "
            "id, or set HF_TOKEN or paste a token that can read it."
        ) from None
    except RevisionNotFoundError:
        raise H3AppError(
            f"revision {ref.revision or 'main'!r} does not exist in Hub repo {ref.repo_id} (asked for {what}): "
            "check the branch, tag or commit sha (e.g. main)."
        ) from None
    except RemoteEntryNotFoundError:
        raise H3AppError(
            f"{what} is not in Hub repo {ref.repo_id}{at}: check the file name (inspect the repo to list its "
            ".safetensors files)."
        ) from None
    except SafetensorsParsingError as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise H3AppError(
            f"{what}{at} is not a valid safetensors file ({reason}): pick another file, or fix the upload."
        ) from None
    except HfHubHTTPError as error:
        status = getattr(getattr(error, "response", None), "status_code", "?")
        raise H3AppError(
            f"the Hub answered HTTP {status} for {what}{at}: retry later (nothing partial was kept)."
        ) from None
    except (httpx2.HTTPError, ConnectionError, TimeoutError, OSError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise H3AppError(
            f"could not get {what}{at} from {constants.ENDPOINT} ({type(error).__name__}: {reason[:200]}): check the "
            "network connection and retry (nothing partial was kept)."
        ) from None
