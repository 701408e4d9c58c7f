"""What ``SOURCE`` names, worked out without any network access: a Hub repo id, an HF URL, a local file or folder.

``SOURCE`` may be
- a Hub model repo id ``owner/name`` (with ``weight_name`` for the file and ``revision`` for branch/tag/commit);
- an HF file URL ``https://huggingface.co/<owner>/<name>/resolve/<rev>/<path>`` or ``…/blob/<rev>/<path>``
  (revision and file taken from it; ``hf.co`` and the configured ``HF_ENDPOINT`` host work too), the repo's
  page ``https://huggingface.co/<owner>/<name>[/tree/<rev>]``, or a folder of it
  ``…/tree/<rev>/<folder>`` (also ``blob/``): ``weight_name`` is then the file's path inside that folder, or
  inside the repo when it already starts with the folder (:func:`folder_weight`);
- a local ``.safetensors`` file (an uploaded file is one), or a local folder holding one or more.

The names in it are checked in ``names.py``, local folders listed and the hosted allow-list applied in
``local.py``, the file chosen in ``weights.py``. Everything here works without any network access.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ...errors import H3AppError
from ...rules.values import check_length
from ..header import PICKLE_SUFFIXES
from .local import LocalPath, check_allowed_local_path, is_allowed_local_path, list_local
from .names import (
    WEIGHT_SUFFIX,
    check_folder,
    check_repo_id,
    check_revision,
    check_weight_name,
    is_given,
    is_url,
    pickle_message,
)
from .weights import choose_weight

HF_HOSTS = ("huggingface.co", "www.huggingface.co", "hf.co")


@dataclass(frozen=True)
class SourceRef:
    """A parsed ``SOURCE``.

    ``kind`` is ``"hub"`` or ``"local"``. Hub: ``repo_id`` (``owner/name``), ``filename`` (path in the repo, or
    None when still to choose), ``revision`` (None means ``main``), ``folder`` (the repo folder a folder URL
    names: the file is chosen in it; ``nested_filename``: see :func:`folder_weight`). Local: ``local_path`` is the
    file when ``filename`` is set (``filename`` is then its name relative to the folder given, or its base name),
    else the folder to choose in.
    """

    kind: str
    repo_id: str | None = None
    filename: str | None = None
    revision: str | None = None
    local_path: Path | None = None
    folder: str | None = None
    nested_filename: str | None = None  # a folder URL's weight name that starts with the folder may mean this too

    def local(self) -> Path:
        """The file or folder of a local source (``local_path``); asking a Hub source for one is refused."""
        if self.local_path is None:
            raise H3AppError(f"{self.describe()} is a Hub source, not a local file or folder.")
        return self.local_path

    def repo(self) -> str:
        """The ``owner/name`` of a Hub source (``repo_id``); asking a local source for one is refused."""
        if self.repo_id is None:
            raise H3AppError(f"{self.describe()} is a local file or folder, not a Hub repo.")
        return self.repo_id

    def describe(self) -> str:
        """``owner/name/file@rev`` or the local path, for messages."""
        if self.kind == "local":
            return str(self.local_path)
        inside = self.filename or self.folder
        text = f"{self.repo_id}/{inside}" if inside else f"{self.repo_id}"
        return f"{text}@{self.revision}" if self.revision else text


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
    if is_url(text):
        return parse_hf_url(text, *_given_names(weight_name, revision))
    path = Path(os.path.abspath(Path(text).expanduser()))
    local_looking = _looks_like_local_path(text)
    if allowed_local_dirs is not None and local_looking:
        # First of all, so that the answer is the same whether or not such a path exists (nor what it is).
        check_allowed_local_path(path, allowed_local_dirs, text)
    weight_name, revision = _given_names(weight_name, revision)

    # In hosted mode a repo-id-like text names a local folder only inside the allowed folders: elsewhere it is a
    # repo id, whether or not such a path exists on the server (nothing about the server's files is revealed).
    usable_locally = allowed_local_dirs is None or is_allowed_local_path(path, allowed_local_dirs)
    if usable_locally and path.exists():
        return _local_ref(path, text, weight_name, revision)
    if text.lower().endswith(PICKLE_SUFFIXES):
        raise H3AppError(pickle_message(text))
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


def _given_names(weight_name: str | None, revision: str | None) -> tuple[str | None, str | None]:
    """``weight_name`` and ``revision`` checked, each None when not given (None or blank)."""
    return (check_weight_name(weight_name) if weight_name is not None and is_given(weight_name) else None,
            check_revision(revision) if revision is not None and is_given(revision) else None)


def _clearly_a_path(text: str) -> bool:
    """Written as a path (a root, a drive, ./, ~, a backslash or a weight-file suffix), not just slashes."""
    return (text.startswith(("/", "./", "../", "~", ".\\")) or text in (".", "..") or "\\" in text
            or re.match(r"^[A-Za-z]:", text) is not None or text.lower().endswith((WEIGHT_SUFFIX, *PICKLE_SUFFIXES)))


def _looks_like_local_path(text: str) -> bool:
    """True when ``text`` cannot be a Hub repo id, so a missing file should be reported as a missing file."""
    return _clearly_a_path(text) or text.count("/") > 1


def parse_hf_url(text: str, weight_name: str | None, revision: str | None) -> SourceRef:
    """The Hub reference an HF URL names (the one URL parser: the registry uses it too): a file's ``/resolve/`` or
    ``/blob/`` URL, a repo page (``/tree/<rev>``), or a folder of it; ``weight_name``/``revision`` must agree."""
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


def folder_weight(folder: str, weight_name: str) -> tuple[str, str | None]:
    """The repo path of ``weight_name`` given with a folder URL, and the other path it may mean: ``folder/name``;
    or, for a name that already starts with ``folder/``, the name itself, which may also mean ``folder/name`` (a
    same-named subfolder; ``hub.resolve_folder_weight`` settles that against the repo's files)."""
    if weight_name.startswith(folder + "/"):
        return weight_name, f"{folder}/{weight_name}"
    return f"{folder}/{weight_name}", None


def _local_ref(path: Path, text: str, weight_name: str | None, revision: str | None) -> SourceRef:
    """An existing local file, or a folder (with the file ``weight_name`` names in it, when given)."""
    if revision is not None:
        raise H3AppError(f"--revision applies to Hub sources, but {text} is a local path: drop --revision.")
    if path.is_file():
        if path.name.lower().endswith(PICKLE_SUFFIXES):
            raise H3AppError(pickle_message(path.name))
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
    """``source`` parsed (:func:`parse_source`), or a ``SourceRef`` as it is (a local one checked against
    ``allowed_local_dirs`` again)."""
    if isinstance(source, SourceRef):
        if weight_name is not None or revision is not None:
            raise ValueError("pass weight_name/revision to parse_source, not with a SourceRef")
        if source.kind == "local" and allowed_local_dirs is not None:
            check_allowed_local_path(source.local(), allowed_local_dirs)
        return source
    return parse_source(source, weight_name, revision, allowed_local_dirs=allowed_local_dirs)


def local_weight(ref: SourceRef, allowed_local_dirs: Sequence[LocalPath] | None) -> tuple[Path, str]:
    """(file, name relative to the folder given) for a local source, choosing in a folder when needed."""
    local = ref.local()
    if ref.filename is not None:
        path, name = local, ref.filename
    else:
        chosen = choose_weight(list_local(local), None, where=f"folder {local}")
        path, name = local.joinpath(*chosen.name.split("/")), chosen.name
    if allowed_local_dirs is not None:
        check_allowed_local_path(path, allowed_local_dirs)
    if not path.is_file():
        raise H3AppError(f"{path} does not exist: check the path.")
    return path, name
