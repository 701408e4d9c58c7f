"""The Hugging Face Hub side of adapter sources: listing a repo at a revision (or what the cache holds offline),
choosing the file, pinned downloads of the file and its ``*.json`` sidecars, access checks, and one ``H3AppError``
line for every way the Hub can fail.

Everything goes through huggingface_hub, so ``HF_ENDPOINT``, ``HF_HOME``/``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` and
``HF_TOKEN`` behave as everywhere else (huggingface_hub reads the first three at import; this module reads its
``constants`` at call time).
"""

from __future__ import annotations

import io
import posixpath
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...errors import H3AppError
from .local import LocalPath
from .names import COMMIT_SHA, WEIGHT_SUFFIX
from .refs import SourceRef
from .weights import WeightFile, choose_weight

SIDECAR_SUFFIX = ".json"
SIDECAR_MAX_BYTES = 1_000_000  # a sidecar larger than this is not an adapter config: not downloaded

ProgressCallback = Callable[[int, "int | None"], None]
Token = str | bool | None  # a token; None: HF_TOKEN or the saved login; False: none at all


def hub_cache(cache_dir: LocalPath | None) -> Path | None:
    """``cache_dir`` as huggingface_hub's downloads take it (None: its own ``HF_HUB_CACHE``)."""
    return Path(cache_dir) if cache_dir is not None else None


@dataclass(frozen=True)
class HubListing:
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


def hub_listing(ref: SourceRef, token: Token, cache_dir: LocalPath | None) -> HubListing:
    """Every file of ``ref``'s repo at its revision: one ``model_info`` call; offline, what the cache holds."""
    from huggingface_hub import HfApi, constants

    if constants.is_offline_mode():
        return cached_listing(ref, cache_dir)
    with hub_errors(ref):
        info = HfApi().model_info(ref.repo(), revision=ref.revision, files_metadata=True, token=token)
    return HubListing(info.sha, {s.rfilename: s.size for s in info.siblings or []})


def cached_listing(ref: SourceRef, cache_dir: LocalPath | None) -> HubListing:
    """The files of ``ref``'s revision that the huggingface_hub cache holds (``refs/<rev>`` → ``snapshots/<sha>``)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    storage = Path(cache_dir or constants.HF_HUB_CACHE) / repo_folder_name(repo_id=ref.repo(), repo_type="model")
    revision = ref.revision or "main"
    commit: str | None = revision if COMMIT_SHA.match(revision) else None
    ref_file = storage / "refs" / revision
    if commit is None and ref_file.is_file():
        commit = ref_file.read_text().strip()
    snapshot = storage / "snapshots" / commit if commit else None
    if snapshot is None or not snapshot.is_dir():
        raise offline_error(ref, ref.filename)
    files = {
        path.relative_to(snapshot).as_posix(): path.stat().st_size
        for path in sorted(snapshot.rglob("*")) if path.is_file()
    }
    return HubListing(commit, files, snapshot=snapshot)


def _hub_where(ref: SourceRef) -> str:
    folder = f" folder {ref.folder}/" if ref.folder else ""
    return f"Hub repo {ref.repo_id}{folder}" + (f" at revision {ref.revision}" if ref.revision else "")


def choose_hub_weight(ref: SourceRef, listing: HubListing) -> WeightFile:
    """The file ``ref`` names in ``listing`` (a folder URL's weight name resolved, its files only), or the only one."""
    ref = resolve_folder_weight(ref, listing.files)
    weights = in_folder(listing.weights, ref.folder)
    if listing.snapshot is not None and ref.filename is not None and ref.filename not in listing.files:
        raise offline_error(ref, ref.filename)
    if listing.snapshot is not None and not weights:
        raise offline_error(ref, None)
    return choose_weight(weights, ref.filename, where=_hub_where(ref))


def resolve_folder_weight(ref: SourceRef, names: Collection[str]) -> SourceRef:
    """``ref`` with the file a folder URL's weight name means among the repo's file ``names``.

    A weight name that already starts with the folder (``adapters/x.safetensors`` with ``…/tree/main/adapters``)
    is that repo path, or ``adapters/adapters/x.safetensors`` (``ref.nested_filename``) when only that one exists;
    when both exist the name is ambiguous: one ``H3AppError`` asking for the full path.
    """
    nested = ref.nested_filename
    if nested is None or nested not in names:
        return ref
    if ref.filename in names:
        raise H3AppError(
            f"--weight-name {ref.filename} in the URL's folder {ref.folder}/ is ambiguous: {ref.repo_id} has both "
            f"{ref.filename} and {nested}; give the file's /resolve/ URL, or the repo id with the full --weight-name."
        )
    return replace(ref, filename=nested, nested_filename=None)


def in_folder(files: Sequence[WeightFile], folder: str | None) -> list[WeightFile]:
    """The files under repo ``folder`` (all of them when None)."""
    return list(files) if folder is None else [f for f in files if f.name.startswith(folder + "/")]


def hub_commit(repo_id: str, filename: str, revision: str | None, token: Token,
               cache_dir: LocalPath | None = None) -> str | None:
    """The commit ``revision`` (default ``main``) points at now: itself for a commit sha (no request), the
    cache's ``refs/<revision>`` offline, else one HEAD of the file."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

    revision = revision or "main"
    if COMMIT_SHA.match(revision):
        return revision
    ref = SourceRef("hub", repo_id=repo_id, filename=filename, revision=revision)
    if constants.is_offline_mode():
        return cached_listing(ref, cache_dir).commit
    with hub_errors(ref, filename):
        return get_hf_file_metadata(hf_hub_url(repo_id, filename, revision=revision), token=token).commit_hash


def check_access(repo_id: str, filename: str, revision: str | None = None, token: Token = None) -> None:
    """Ask the Hub (a HEAD with ``token``) whether this caller may read ``repo_id/filename``; the one-line gated /
    not-found errors otherwise. A cached copy proves nothing about *this* caller's access (hosted mode serves many
    visitors from one cache). Offline there is nobody to ask: the check is skipped."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

    if constants.HF_HUB_OFFLINE:
        return
    ref = SourceRef(kind="hub", repo_id=repo_id, filename=filename, revision=revision)
    with hub_errors(ref, filename):
        get_hf_file_metadata(hf_hub_url(repo_id, filename, revision=revision), token=token)


def download_pinned(ref: SourceRef, filename: str, listing: HubListing, token: Token,
                     cache_dir: LocalPath | None,
                     progress: ProgressCallback | None) -> tuple[Path, str | None]:
    """Download by the revision asked (so the cache records ``refs/<rev>`` for offline use); the commit the bytes
    came from is the snapshot folder huggingface_hub put them in."""
    from huggingface_hub import hf_hub_download

    with hub_errors(ref, filename):
        path = Path(hf_hub_download(
            ref.repo(), filename, revision=ref.revision, token=token, cache_dir=hub_cache(cache_dir),
            tqdm_class=_progress_relay(progress) if progress is not None else None,
        ))
    depth = len(filename.split("/"))
    parts = path.parts
    commit = parts[-depth - 1] if len(parts) > depth + 1 and parts[-depth - 2] == "snapshots" else None
    return path, commit if commit and COMMIT_SHA.match(commit) else listing.commit


def download_sidecar(ref: SourceRef, name: str, commit: str | None, token: Token,
                      cache_dir: LocalPath | None) -> None:
    """Download one ``*.json`` sidecar at ``commit`` into the cache; one that vanished since listing is skipped."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import RemoteEntryNotFoundError

    with hub_errors(ref, name):
        try:
            hf_hub_download(ref.repo(), name, revision=commit or ref.revision, token=token,
                           cache_dir=hub_cache(cache_dir))
        except RemoteEntryNotFoundError:
            return  # listed a moment ago, gone at that commit: a sidecar is optional


def remote_size(ref: SourceRef, filename: str, token: Token) -> int | None:
    """The size in bytes the Hub gives for ``filename`` (one HEAD), when the listing had none."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    with hub_errors(ref, filename):
        return get_hf_file_metadata(hf_hub_url(ref.repo(), filename, revision=ref.revision), token=token).size


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


def clean_token(token: Token) -> str | bool | None:
    """None or an empty pasted token: huggingface_hub's default (``HF_TOKEN``, else the saved login).
    ``False``: send no token at all (hosted mode, so the server's own token never serves a visitor)."""
    if token is None or token is False:
        return token
    if token is True:
        raise ValueError("token=True is not supported: pass a token string, None (default) or False (none)")
    token = token.strip()
    return token or None


def offline_error(ref: SourceRef, filename: str | None) -> H3AppError:
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
def hub_errors(ref: SourceRef, filename: str | None = None) -> Iterator[None]:
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
        raise offline_error(ref, filename) from None
    except LocalEntryNotFoundError:
        if constants.is_offline_mode():
            raise offline_error(ref, filename) from None
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
    except FileNotFoundError:
        raise  # a cached file trimmed away under us: retry_if_trimmed downloads it again
    except (httpx2.HTTPError, ConnectionError, TimeoutError, OSError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise H3AppError(
            f"could not get {what}{at} from {constants.ENDPOINT} ({type(error).__name__}: {reason[:200]}): check the "
            "network connection and retry (nothing partial was kept)."
        ) from None
