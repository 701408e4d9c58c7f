"""Where an adapter file comes from: a Hub repo id, an HF URL, a local file or folder → a local file, pinned.

The entry points: ``list_weight_files`` (what a source offers), ``read_header`` (header and 0-dim scalars only;
Hub files with HTTP Range requests, so format, rank and alpha show before a multi-GB download), ``fetch`` (a local
copy of the file and its small ``*.json`` sidecars such as ``adapter_config.json``, in the huggingface_hub cache,
pinned to the commit it came from) and ``current_identity`` (has the source moved on since?). What ``SOURCE`` may
be is in ``refs.py`` (no network), the Hub side in ``hub.py``, the remote header reader in ``remote_header.py``.
Every failure is one ``H3AppError`` line naming the repo and file; a cached file trimmed away by another request
while it is read is downloaded again once.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..header import ADAPTER_CONFIG_NAME, VanishedFile, read_local_header, vanished
from ..types import HeaderView
from .hub import (
    SIDECAR_SUFFIX,
    ProgressCallback,
    Token,
    choose_hub_weight,
    clean_token,
    download_pinned,
    download_sidecar,
    hub_commit,
    hub_listing,
    in_folder,
    remote_size,
)
from .limits import check_size
from .local import LocalPath, list_local
from .refs import SourceRef, as_ref, local_weight
from .remote_header import read_remote_header
from .weights import WeightFile


@functools.lru_cache(maxsize=256)
def file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """Hex sha256 of ``path``; ``size`` and ``mtime_ns`` are part of the cache key, so a rewritten file is hashed
    again. Every job names its adapter file again, and a 1.3 GB Turbo file takes seconds to hash."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


@dataclass(frozen=True)
class SourceIdentity:
    """Which version of an adapter file a source stands for, known without reading it: local files by
    ``(resolved path, size in bytes, mtime_ns)``, Hub files by ``(repo_id, filename, commit)``. Equal identities
    mean the same bytes; a rewritten local file or a branch that moved on gives a different one."""

    kind: str
    where: str
    version: tuple[Any, ...]

    @classmethod
    def of_local(cls, path: LocalPath) -> SourceIdentity:
        """From ``stat``; a missing file has version ``(None, None)`` (never equal to a real one)."""
        resolved = os.path.realpath(path)
        try:
            stat = os.stat(resolved)
        except FileNotFoundError:
            return cls("local", resolved, (None, None))
        return cls("local", resolved, (stat.st_size, stat.st_mtime_ns))

    @classmethod
    def of_hub(cls, repo_id: str, filename: str, commit: str | None) -> SourceIdentity:
        return cls("hub", f"{repo_id}/{filename}", (commit,))


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
    identity: SourceIdentity | None = None  # the version fetched (see current_identity)
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


def list_weight_files(source: LocalPath | SourceRef, revision: str | None = None, token: Token = None,
                      *, allowed_local_dirs: Sequence[LocalPath] | None = None,
                      cache_dir: LocalPath | None = None) -> list[WeightFile]:
    """The ``.safetensors`` files (name, size in bytes) of a Hub repo at ``revision``, a folder, or a file.

    Hub: one ``model_info(files_metadata=True)`` call. Offline (``HF_HUB_OFFLINE=1``): what the local cache holds
    for that revision.
    """
    ref = as_ref(source, None, revision, allowed_local_dirs)
    if ref.kind == "local":
        if ref.filename is not None:
            return [WeightFile(ref.filename, ref.local().stat().st_size)]
        return list_local(ref.local())
    return in_folder(hub_listing(ref, clean_token(token), cache_dir).weights, ref.folder)


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
    ref = as_ref(source, weight_name, revision, allowed_local_dirs)
    if ref.kind == "local":
        path, _ = local_weight(ref, allowed_local_dirs)
        return read_local_header(path)
    token = clean_token(token)
    return retry_if_trimmed(lambda: _read_hub_header(ref, token, cache_dir))


def _read_hub_header(ref: SourceRef, token: Token, cache_dir: LocalPath | None) -> HeaderView:
    listing = hub_listing(ref, token, cache_dir)
    weight = choose_hub_weight(ref, listing)
    if listing.snapshot is not None:
        return read_local_header(listing.snapshot.joinpath(*weight.name.split("/")))
    return read_remote_header(ref, weight, listing, token, cache_dir)


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
    ref = as_ref(source, weight_name, revision, allowed_local_dirs)
    if ref.kind == "local":
        path, name = local_weight(ref, allowed_local_dirs)
        size = path.stat().st_size
        check_size(size, max_bytes, str(path))
        if progress is not None:
            progress(size, size)
        sidecars = tuple(sorted(p for p in path.parent.glob("*" + SIDECAR_SUFFIX) if p.is_file()))
        config = path.with_name(ADAPTER_CONFIG_NAME)
        return AdapterFile(path=path, adapter_config_path=config if config.is_file() else None, repo_id=None,
                           revision=None, commit=None, filename=name, size=size, sidecar_paths=sidecars,
                           identity=SourceIdentity.of_local(path))

    token = clean_token(token)
    return retry_if_trimmed(lambda: _fetch_hub(ref, token, progress, max_bytes, cache_dir))


def retry_if_trimmed(action: Callable[[], Any]) -> Any:
    """Run ``action``; if a cached file vanished under it (another request trimmed the download cache), run it once
    more, which downloads again; a second loss is one ``H3AppError`` line."""
    with contextlib.suppress(FileNotFoundError, VanishedFile):  # the first loss: try once more
        return action()
    try:
        return action()
    except FileNotFoundError as error:
        raise vanished(error.filename or "the adapter file") from None


def _fetch_hub(ref: SourceRef, token: Token, progress: ProgressCallback | None, max_bytes: int | None,
               cache_dir: LocalPath | None) -> AdapterFile:
    listing = hub_listing(ref, token, cache_dir)
    weight = choose_hub_weight(ref, listing)
    where = f"{ref.repo_id}/{weight.name}"
    if listing.snapshot is not None:
        path = listing.snapshot.joinpath(*weight.name.split("/"))
        commit = listing.commit
        sidecar_names = listing.sidecars(weight.name)
    else:
        if max_bytes is not None:
            check_size(weight.size if weight.size is not None else remote_size(ref, weight.name, token),
                       max_bytes, where)
        path, commit = download_pinned(ref, weight.name, listing, token, cache_dir, progress)
        sidecar_names = listing.sidecars(weight.name)
        for sidecar in sidecar_names:
            download_sidecar(ref, sidecar, commit, token, cache_dir)
    size = path.stat().st_size
    check_size(size, max_bytes, where)
    if progress is not None:
        progress(size, size)
    sidecars = tuple(p for p in (path.parent / posixpath.basename(n) for n in sidecar_names) if p.is_file())
    config = path.with_name(ADAPTER_CONFIG_NAME)
    return AdapterFile(path=path, adapter_config_path=config if config.is_file() else None, repo_id=ref.repo_id,
                       revision=ref.revision or "main", commit=commit, filename=weight.name, size=size,
                       sidecar_paths=sidecars, identity=SourceIdentity.of_hub(ref.repo(), weight.name, commit))


def current_identity(file: AdapterFile, token: Token = None, *, cache_dir: LocalPath | None = None) -> SourceIdentity:
    """What ``file``'s source resolves to now, cheaply: local ``stat``; Hub: the commit its revision points at (no
    request for a commit sha; one HEAD online; the cache's ``refs/<revision>`` offline). Compare it with
    ``file.identity`` to notice that a rewritten file or a branch that moved on no longer matches what is loaded."""
    if file.repo_id is None:
        return SourceIdentity.of_local(file.path)
    commit = hub_commit(file.repo_id, file.filename, file.revision, clean_token(token), cache_dir)
    return SourceIdentity.of_hub(file.repo_id, file.filename, commit)

