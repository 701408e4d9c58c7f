"""Find MiniMax-H3 adapters on the Hugging Face Hub: one ``huggingface_hub.list_models`` call filtered by the
``base_model:adapter:MiniMaxAI/MiniMax-H3`` tag (the base model itself, its finetunes and other models' LoRAs carry
other tags and are never listed), narrowed by a query on the repo name and sorted as asked.

Sizes. The listing expands ``siblings`` (the file names) with downloads, likes, last change, gated and tags, but the
Hub's model *listing* gives no file sizes (only ``model_info(files_metadata=True)``, i.e. ``?blobs=true``, does).
So each listed repo that holds a ``.safetensors`` file costs one more ``model_info`` call, made in parallel
(``SIZE_WORKERS``) and bounded by the result limit (``MAX_LIMIT``): a search makes at most ``1 + limit`` requests.
A repo whose sizes cannot be read keeps its files with ``size`` None (its check reads them again).

Offline (``HF_HUB_OFFLINE=1``) there is no Hub to ask and nothing in the cache lists what exists: one
``H3AppError`` line saying so, before any request. A Hub that does not answer ends the search after
``SEARCH_SECONDS`` with one line (huggingface_hub's listing has no timeout of its own, and retries a refused
connection for ~25 s).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import H3AppError
from ...lru import LRU
from ...rules.choices import REAL_REPO_ID
from ...rules.values import check_length
from .hub import Token, hub_errors
from .names import WEIGHT_SUFFIX
from .refs import SourceRef

if TYPE_CHECKING:  # huggingface_hub's names for list_models' arguments (the module itself loads lazily)
    from huggingface_hub.hf_api import ExpandModelProperty_T, ModelSort_T

BASE_MODEL_TAG = f"base_model:adapter:{REAL_REPO_ID}"  # the Hub's tag on every adapter of the base model
SORTS: dict[str, ModelSort_T] = {"downloads": "downloads", "likes": "likes", "updated": "last_modified"}  # ours → list_models' sort
DEFAULT_SORT = "downloads"
DEFAULT_LIMIT = 20
MAX_LIMIT = 50  # results of one search, so also the size requests it may make
MAX_QUERY_CHARS = 96  # the Hub's longest repo name
SEARCH_SECONDS = 15.0  # the longest a search waits for the Hub, listing and sizes together
SIZE_SECONDS = 10.0  # one repo's size request
SIZE_WORKERS = 8
OFFLINE = ("searching the Hub needs the network, and HF_HUB_OFFLINE=1 is set: unset HF_HUB_OFFLINE to search, or "
           "inspect a repo id you know (its files are read from the cache).")
LISTED: list[ExpandModelProperty_T] = ["downloads", "likes", "lastModified", "gated", "siblings", "tags"]  # expand


@dataclass(frozen=True)
class HubFile:
    """A ``.safetensors`` file of a listed repo; ``size`` in bytes (None: the Hub gave none)."""

    name: str
    size: int | None


@dataclass(frozen=True)
class HubAdapter:
    """One listed adapter repo. ``updated``: its last change (ISO 8601, UTC); ``gated``: access needs accepting
    the repo's terms (and a token)."""

    repo_id: str
    downloads: int
    likes: int
    updated: str | None
    gated: bool
    files: tuple[HubFile, ...]

    def to_json(self) -> dict[str, Any]:
        return {"repo_id": self.repo_id, "downloads": self.downloads, "likes": self.likes, "updated": self.updated,
                "gated": self.gated, "files": [{"name": f.name, "size": f.size} for f in self.files]}


def check_search(query: str | None, sort: str, limit: int) -> tuple[str | None, str, int]:
    """(query or None, sort, limit) as the search takes them, or one line naming what is wrong."""
    query = (query or "").strip() or None
    if query is not None:
        check_length(query, "the search query", MAX_QUERY_CHARS)
    if sort not in SORTS:
        raise H3AppError(f"unknown sort {sort!r}: use one of {', '.join(SORTS)}.")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise H3AppError(f"the result limit must be a whole number from 1 to {MAX_LIMIT}, got {limit!r}.")
    return query, sort, limit


def search_adapters(query: str | None = None, *, sort: str = DEFAULT_SORT, limit: int = DEFAULT_LIMIT,
                    token: Token = None, timeout: float | None = None) -> list[HubAdapter]:
    """The Hub's adapters of MiniMax-H3 whose repo id contains ``query`` (any when empty), ``sort`` first (most
    downloads, likes, or latest change), at most ``limit``; ``token``: as everywhere (None: HF_TOKEN or the saved
    login; False: none). One ``H3AppError`` line offline, when the Hub fails, or after ``timeout`` seconds
    (default ``SEARCH_SECONDS``)."""
    from huggingface_hub import constants

    query, sort, limit = check_search(query, sort, limit)
    if constants.is_offline_mode():
        raise H3AppError(OFFLINE)
    return _within(SEARCH_SECONDS if timeout is None else timeout, lambda: _search(query, sort, limit, token))


def _within(seconds: float, work: Callable[[], list[HubAdapter]]) -> list[HubAdapter]:
    """``work()``'s answer, or one line after ``seconds``. It runs on a daemon thread, so that a Hub that never
    answers holds neither the caller nor the end of the process."""
    from huggingface_hub import constants

    answers: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

    def run() -> None:
        try:
            answers.put((True, work()))
        except BaseException as error:  # handed to the caller, who raises it
            answers.put((False, error))

    threading.Thread(target=run, name="hub-search", daemon=True).start()
    try:
        ok, answer = answers.get(timeout=seconds)
    except queue.Empty:
        raise H3AppError(f"the Hub at {constants.ENDPOINT} did not answer a search within {seconds:g} s: check the "
                         "network connection (or HF_ENDPOINT) and retry.") from None
    if not ok:
        raise answer
    return answer


def _search(query: str | None, sort: str, limit: int, token: Token) -> list[HubAdapter]:
    from huggingface_hub import HfApi

    with _listing_errors():
        models = list(HfApi().list_models(filter=BASE_MODEL_TAG, search=query, sort=SORTS[sort], limit=limit,
                                          expand=LISTED, token=token))
    models = [m for m in models if m.tags is None or BASE_MODEL_TAG in m.tags]  # the filter, checked
    names = {m.id: sorted(s.rfilename for s in m.siblings or [] if s.rfilename.lower().endswith(WEIGHT_SUFFIX))
             for m in models}
    listed_sizes = {m.id: {s.rfilename: s.size for s in m.siblings or []} for m in models}
    missing = [m.id for m in models if any(listed_sizes[m.id].get(n) is None for n in names[m.id])]
    sizes = _sizes(missing, token)
    found = [HubAdapter(repo_id=m.id, downloads=int(m.downloads or 0), likes=int(m.likes or 0),
                        updated=m.last_modified.isoformat() if m.last_modified else None, gated=bool(m.gated),
                        files=tuple(HubFile(n, sizes.get(m.id, listed_sizes[m.id]).get(n)) for n in names[m.id]))
             for m in models]
    return sort_results(found, sort)


def _sizes(repo_ids: Sequence[str], token: Token) -> dict[str, dict[str, int | None]]:
    """repo id → {file name: size} from one ``model_info(files_metadata=True)`` per repo, in parallel; a repo whose
    call fails is left out (its files keep no size)."""
    if not repo_ids:
        return {}

    def one(repo_id: str) -> dict[str, int | None] | None:
        from huggingface_hub import HfApi

        try:
            with hub_errors(SourceRef("hub", repo_id=repo_id)):
                info = HfApi().model_info(repo_id, files_metadata=True, timeout=SIZE_SECONDS, token=token)
        except H3AppError:
            return None
        return {s.rfilename: s.size for s in info.siblings or []}

    answers = _parallel(one, repo_ids, SIZE_WORKERS)
    return {repo_id: sizes for repo_id, sizes in zip(repo_ids, answers) if sizes is not None}


def _parallel(fn: Callable[[str], Any], items: Sequence[str], workers: int) -> list[Any]:
    """``[fn(item) for item in items]`` on at most ``workers`` daemon threads (a pool's threads would hold the end
    of the process while a Hub that does not answer keeps them waiting)."""
    answers: list[Any] = [None] * len(items)
    pending: queue.SimpleQueue[int] = queue.SimpleQueue()
    for index in range(len(items)):
        pending.put(index)

    def work() -> None:
        while True:
            try:
                index = pending.get_nowait()
            except queue.Empty:
                return
            answers[index] = fn(items[index])

    threads = [threading.Thread(target=work, name="hub-sizes", daemon=True)
               for _ in range(min(workers, len(items)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


@contextmanager
def _listing_errors() -> Iterator[None]:
    """The listing's failures as one line: offline, an HTTP error status, no connection."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    try:
        yield
    except OfflineModeIsEnabled:
        raise H3AppError(OFFLINE) from None
    except HfHubHTTPError as error:
        status = getattr(getattr(error, "response", None), "status_code", "?")
        raise H3AppError(f"the Hub at {constants.ENDPOINT} answered the search with HTTP {status}: retry later.") \
            from None
    except (httpx2.HTTPError, ConnectionError, TimeoutError, OSError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise H3AppError(f"could not reach the Hub at {constants.ENDPOINT} to search ({type(error).__name__}: "
                         f"{reason[:200]}): check the network connection (or HF_ENDPOINT) and retry.") from None


class RecentSearches:
    """Answers kept for ``seconds`` (at most ``entries``, least recently used first out), so that the same search
    asked again within that time costs no request. The caller's key must hold everything that changes the answer
    (endpoint, query, sort, limit, the token's digest)."""

    def __init__(self, seconds: float, entries: int = 128) -> None:
        self.seconds = seconds
        self._held: LRU[Any, tuple[float, Any]] = LRU(entries)

    def get_or_search(self, key: Any, search: Callable[[], Any]) -> Any:
        """The answer kept for ``key`` while fresh, else ``search()`` (kept when it succeeds)."""
        held = self._held.get(key)
        if held is not None and time.monotonic() - held[0] < self.seconds:
            return held[1]
        answer = search()
        self._held.put(key, (time.monotonic(), answer))
        return answer


def sort_results(results: Sequence[HubAdapter], sort: str) -> list[HubAdapter]:
    """``results`` in the asked order (largest first; the Hub's own order among equals)."""
    key: Callable[[HubAdapter], Any] = {
        "downloads": lambda r: r.downloads, "likes": lambda r: r.likes, "updated": lambda r: r.updated or ""}[sort]
    return sorted(results, key=key, reverse=True)


__all__ = ["BASE_MODEL_TAG", "DEFAULT_LIMIT", "DEFAULT_SORT", "MAX_LIMIT", "SORTS", "HubAdapter", "HubFile",
           "RecentSearches", "check_search", "search_adapters", "sort_results"]
