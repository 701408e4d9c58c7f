"""A local stand-in for the Hugging Face Hub, for tests: real HTTP on 127.0.0.1, real ``huggingface_hub`` client.

What it serves (what huggingface_hub 2.4 calls; read from its ``hf_api.py``, ``file_download.py``,
``utils/_http.py``):

- ``GET /api/models/{repo}`` and ``GET /api/models/{repo}/revision/{rev}`` — ``HfApi.model_info`` /
  ``repo_info``: ``id``, ``sha`` (the commit), ``gated``, ``siblings`` (with ``size``, ``blobId`` and ``lfs`` when
  the query has ``blobs=True``, i.e. ``files_metadata=True``).
- ``GET /api/models/{repo}/tree/{rev}[/{path}]`` — ``HfApi.list_repo_tree`` (used by ``snapshot_download``).
- ``GET /api/models`` — ``HfApi.list_models``: ``filter`` (tags, from ``set_card``), ``search``, ``sort``,
  ``limit``, ``expand`` (``siblings`` without sizes, as on the Hub).
- ``HEAD`` and ``GET /{repo}/resolve/{rev}/{path}`` — ``get_hf_file_metadata`` / ``hf_hub_download`` /
  ``parse_safetensors_file_metadata``: ``ETag`` (sha256 for LFS-like files, git blob sha1 for small text files),
  ``X-Repo-Commit``, ``Content-Length``, ``Accept-Ranges``, and single ``Range: bytes=a-b`` / ``a-`` / ``-n``
  requests answered with 206 and ``Content-Range`` (416 when unsatisfiable).
- Errors carry the ``X-Error-Code`` header that ``hf_raise_for_status`` maps to exceptions: ``RepoNotFound`` (401
  without ``Authorization``, 404 with one, as the Hub does) → ``RepositoryNotFoundError``; ``RevisionNotFound`` →
  ``RevisionNotFoundError``; ``EntryNotFound`` (with ``X-Repo-Commit``) → ``RemoteEntryNotFoundError``;
  ``GatedRepo`` (401 without a token, 403 with a wrong one) → ``GatedRepoError``. Model info and the tree stay
  public for gated repos, as on the Hub.

Repos are built from local folders (``add_repo(repo_id, folder)``), each revision with a fixed fake 40-hex commit
(the ``main`` branch, plus any ``add_revision``); files are read from the folder on every request, so a test can
change them. Every request is logged (``hub.requests``) so tests can assert what was (not) fetched.
``interrupt_download(name)`` cuts the next GET of that file off half-way (the server sends the full
``Content-Length`` and closes the connection after half the bytes); ``then="fail"`` answers the client's resume
requests with 503 until ``clear_interruptions()``, ``then="resume"`` serves them.

Pointing huggingface_hub at it. huggingface_hub reads ``HF_ENDPOINT``, ``HF_HOME``, ``HF_HUB_OFFLINE`` once, at
import, into ``huggingface_hub.constants`` (``ENDPOINT``, ``HUGGINGFACE_CO_URL_TEMPLATE`` — the resolve-URL
template built from it —, ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``, token paths), and every call reads those module
attributes at call time (``HfApi()`` copies ``constants.ENDPOINT`` when constructed). So in-process tests
monkeypatch those attributes (``point_huggingface_hub_at``; the ``fake_hub`` fixture does it), and set the
environment variables too so that subprocesses and late importers agree. Cache paths are moved with
``tests/hf_home.py`` (import-time copies included, e.g. ``scan_cache_dir()``'s default); other code that copied
a constant into its own module at import (``from huggingface_hub.constants import ENDPOINT``; diffusers' and transformers' own offline
flags) is not covered: test such code in a subprocess with ``hub.subprocess_env(hf_home)``. The real user token
(``~/.cache/huggingface/token``, ``HF_TOKEN``) is hidden from tests: token paths move under the test's HF_HOME.

Use: the ``fake_hub`` fixture (a plugin: ask for it by name), or ``with FakeHub() as hub: ...``
(``from hub_server import FakeHub``).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest
from hf_home import use_hf_home

# Files served as if stored in git (small text); everything else looks like an LFS file (sha256 ETag, `lfs` info).
_TEXT_SUFFIXES = (".json", ".md", ".txt", ".gitattributes", ".yaml", ".yml")
_LFS_POINTER_SIZE = 134
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")
LOG_WAIT_SECONDS = 10.0  # longest wait for a request in flight to be logged before the log is read
HOLD_SECONDS = 120.0  # longest a held download waits for release_held()
LISTING_DEFAULT = ("downloads", "likes", "lastModified", "tags", "private", "gated")  # without ``expand``
LISTING_SORTS = ("downloads", "likes", "lastModified", "createdAt", "trendingScore")


def fake_commit(repo_id: str, revision: str = "main") -> str:
    """A fixed 40-hex commit id for (repo, revision), the same on every run."""
    return hashlib.sha1(f"fake-commit:{repo_id}@{revision}".encode()).hexdigest()


@dataclass(frozen=True)
class LoggedRequest:
    """One request the fake Hub answered. ``path`` is percent-decoded (``/owner/name/resolve/main/a.safetensors``);
    ``sent_bytes`` counts body bytes actually written (less than the Content-Length when cut off)."""

    method: str
    path: str
    query: str
    range: str | None
    status: int
    sent_bytes: int
    authorization: bool
    interrupted: bool = False

    @property
    def is_full_get(self) -> bool:
        """A GET answered with the whole file (200), as opposed to a Range read (206)."""
        return self.method == "GET" and self.status == 200 and self.range is None


@dataclass
class _Revision:
    commit: str
    folder: Path


@dataclass
class _Repo:
    repo_id: str
    revisions: dict[str, _Revision]  # branch/tag name → revision
    gated_token: str | None = None  # None: public; else the one token that has accepted the terms

    def find(self, revision: str) -> _Revision | None:
        if revision in self.revisions:
            return self.revisions[revision]
        for candidate in self.revisions.values():
            if candidate.commit == revision:
                return candidate
        return None


@dataclass
class _Interruption:
    after_bytes: int | None
    then: str
    cut: bool = False


@dataclass
class _FileEntry:
    path: str
    data: bytes
    sha256: str = field(init=False)
    git_sha1: str = field(init=False)

    def __post_init__(self) -> None:
        self.sha256 = hashlib.sha256(self.data).hexdigest()
        self.git_sha1 = hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()

    @property
    def is_lfs(self) -> bool:
        return not self.path.lower().endswith(_TEXT_SUFFIXES)

    @property
    def etag(self) -> str:
        return self.sha256 if self.is_lfs else self.git_sha1


def _files_of(folder: Path) -> dict[str, Path]:
    """Relative posix path → file, for every file under ``folder`` (hidden ``.git`` folders skipped)."""
    found: dict[str, Path] = {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.is_file() and ".git" not in relative.parts:
            found[relative.as_posix()] = path
    return found


class FakeHub:
    """A threaded HTTP server on 127.0.0.1 that answers like the Hub for the repos added to it.

    ``endpoint`` is its base URL (``http://127.0.0.1:PORT``); ``requests`` the log of answered requests.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)  # notified when a request in flight has been logged
        self._in_flight = 0  # requests being answered: logged only once the answer is sent
        self._repos: dict[str, _Repo] = {}
        self._log: list[LoggedRequest] = []
        self._interruptions: dict[str, _Interruption] = {}
        self._released = threading.Event()  # set by release_held()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._cards: dict[str, dict[str, Any]] = {}  # repo id → what the model listing says of it (set_card)

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self, port: int = 0) -> FakeHub:
        """Listen on ``port`` of 127.0.0.1 (0: a free one)."""
        hub = self

        class Handler(_HubHandler):
            fake_hub = hub

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        server.block_on_close = False  # idle keep-alive connections must not block shutdown
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-hub",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every open connection. A client's pooled keep-alive connection would otherwise
        still be answered by this stopped hub: a later hub on the same port (the OS reuses ports) would never see
        those requests, and the client would get this hub's files."""
        self._released.set()  # a held download ends rather than outliving its hub
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._lock:
            connections, self._connections = list(self._connections), set()
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the client

    def _opened(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.add(connection)

    def _closed(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.discard(connection)

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeHub is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- content -----------------------------------------------------------------------------------------------
    def add_repo(self, repo_id: str, folder: str | Path, *, commit: str | None = None,
                 gated_token: str | None = None) -> str:
        """Serve ``folder`` as model repo ``repo_id`` on branch ``main``; returns its commit.

        ``gated_token``: make the repo gated; only ``Authorization: Bearer <gated_token>`` may download.
        """
        if not _REPO_ID.match(repo_id):
            raise ValueError(f"fake repo ids are owner/name, got {repo_id!r}")
        commit = commit or fake_commit(repo_id)
        with self._lock:
            self._repos[repo_id] = _Repo(repo_id, {"main": _Revision(commit, Path(folder))}, gated_token)
        return commit

    def add_revision(self, repo_id: str, revision: str, folder: str | Path, *, commit: str | None = None) -> str:
        """Add a branch or tag ``revision`` (its own folder and commit) to an added repo; returns the commit."""
        commit = commit or fake_commit(repo_id, revision)
        with self._lock:
            self._repos[repo_id].revisions[revision] = _Revision(commit, Path(folder))
        return commit

    def interrupt_download(self, filename: str, *, after_bytes: int | None = None, then: str = "fail") -> None:
        """Cut the next full GET of ``filename`` (path in repo) after ``after_bytes`` (default: half the file).

        ``then="fail"``: later GETs of that file get 503 until ``clear_interruptions()``; ``then="resume"``:
        later GETs (the client's ``Range: bytes=N-`` resume) are served normally; ``then="hold"``: the connection is
        not cut but held still after ``after_bytes`` until ``release_held()`` (a slow link), then the rest is sent.
        """
        if then not in ("fail", "resume", "hold"):
            raise ValueError("then must be 'fail', 'resume' or 'hold'")
        with self._lock:
            self._interruptions[filename] = _Interruption(after_bytes, then)

    def clear_interruptions(self) -> None:
        with self._lock:
            self._interruptions.clear()

    def set_card(self, repo_id: str, *, tags: tuple[str, ...] | list[str] = (), downloads: int = 0, likes: int = 0,
                 last_modified: str = "2025-01-01T00:00:00.000Z") -> None:
        """What the model listing (``GET /api/models``) says of an added repo: its tags (``base_model:adapter:…``),
        downloads, likes and last change (ISO 8601). Repos without a card are listed with no tags."""
        with self._lock:
            self._cards[repo_id] = {"tags": list(tags), "downloads": downloads, "likes": likes,
                                    "lastModified": last_modified}

    def release_held(self) -> None:
        """Send the rest of every download held by ``interrupt_download(..., then="hold")``."""
        self._released.set()

    # -- log ---------------------------------------------------------------------------------------------------
    @property
    def requests(self) -> list[LoggedRequest]:
        """The log, once every request in flight is in it: a client has its answer before the handler thread logs
        it, so reading the log right after a call must wait for that thread (a race under load otherwise)."""
        with self._answered:
            self._answered.wait_for(lambda: self._in_flight == 0, timeout=LOG_WAIT_SECONDS)
            return list(self._log)

    def clear_log(self) -> None:
        with self._answered:
            self._answered.wait_for(lambda: self._in_flight == 0, timeout=LOG_WAIT_SECONDS)
            self._log.clear()

    def requests_for(self, repo_id: str, filename: str) -> list[LoggedRequest]:
        """The logged HEAD/GET requests on ``/{repo_id}/resolve/<any revision>/{filename}``."""
        prefix = f"/{repo_id}/resolve/"
        return [
            r for r in self.requests
            if r.path.startswith(prefix) and _strip_revision(r.path[len(prefix):]) == filename
        ]

    def downloaded_files(self, repo_id: str) -> set[str]:
        """Names of the files of ``repo_id`` that got any GET on ``resolve`` (full or ranged)."""
        prefix = f"/{repo_id}/resolve/"
        return {
            _strip_revision(r.path[len(prefix):]) for r in self.requests
            if r.method == "GET" and r.path.startswith(prefix)
        }

    def _begin(self) -> None:
        with self._answered:
            self._in_flight += 1

    def _record(self, entry: LoggedRequest | None) -> None:
        """Log one answered request (None: the answer broke off before it could be logged) and end its flight."""
        with self._answered:
            if entry is not None:
                self._log.append(entry)
            self._in_flight -= 1
            self._answered.notify_all()

    # -- environment -------------------------------------------------------------------------------------------
    def subprocess_env(self, hf_home: str | Path, base: Mapping[str, str] | None = None,
                       token: str | None = None) -> dict[str, str]:
        """Environment for a subprocess that should talk to this fake Hub (online, cache under ``hf_home``)."""
        env = dict(os.environ if base is None else base)
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
                     "TRANSFORMERS_OFFLINE", "HF_TOKEN_PATH"):
            env.pop(name, None)
        env.update(HF_ENDPOINT=self.endpoint, HF_HOME=str(hf_home), HF_HUB_OFFLINE="0",
                   HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
        if token is not None:
            env["HF_TOKEN"] = token
        return env


def _strip_revision(rest: str) -> str:
    """``main/a/b.safetensors`` → ``a/b.safetensors`` (``refs/pr/N/…`` counts as one revision)."""
    match = re.match(r"^refs/pr/\d+/(.*)$", rest)
    if match:
        return match.group(1)
    return rest.split("/", 1)[1] if "/" in rest else ""


def point_huggingface_hub_at(monkeypatch: pytest.MonkeyPatch, endpoint: str, hf_home: str | Path, *,
                             offline: bool = False) -> None:
    """Make this process's huggingface_hub use ``endpoint``, a cache under ``hf_home``, and no user token.

    Patches the ``huggingface_hub.constants`` attributes read at call time (see the module docstring) and the
    matching environment variables; ``monkeypatch`` undoes all of it at the end of the test.
    """
    from huggingface_hub import constants

    hf_home = Path(hf_home)
    endpoint = endpoint.rstrip("/")
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    use_hf_home(monkeypatch, hf_home)  # HF_HOME, HF_HUB_CACHE, token paths and their import-time copies
    set_offline(monkeypatch, offline)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)


def set_offline(monkeypatch: pytest.MonkeyPatch, offline: bool) -> None:
    """Switch huggingface_hub's offline mode (``constants.HF_HUB_OFFLINE``, read by every request) and the env."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A started ``FakeHub`` with huggingface_hub pointed at it, online, cache in ``tmp_path / "hf_home"``."""
    from huggingface_hub import close_session

    from h3app.adapters import memo

    hub = FakeHub().start()
    point_huggingface_hub_at(monkeypatch, hub.endpoint, tmp_path / "hf_home")
    memo.clear()  # fake repos reuse names and commits (and ports may be reused): no header from another test
    try:
        yield hub
    finally:
        close_session()  # drop pooled keep-alive connections to this server
        hub.stop()
        memo.clear()


# ------------------------------------------------------------------------------------------------------------------
class _HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the Hub; every response carries a Content-Length
    timeout = 30  # idle keep-alive connections end by themselves
    fake_hub: FakeHub

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence stderr logging
        return

    def setup(self) -> None:
        super().setup()
        self.fake_hub._opened(self.connection)

    def finish(self) -> None:
        self.fake_hub._closed(self.connection)
        super().finish()

    # -- plumbing ----------------------------------------------------------------------------------------------
    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch(head=False)

    def _dispatch(self, head: bool) -> None:
        split = urlsplit(self.path)
        self._query = parse_qs(split.query)
        self._raw_path = split.path
        self._sent = 0
        self._interrupted = False
        self._cut_after: int | None = None
        self.fake_hub._begin()
        try:
            status = self._route(head)
        except BaseException:
            self.fake_hub._record(None)
            raise
        self.fake_hub._record(LoggedRequest(
            method="HEAD" if head else "GET",
            path=unquote(split.path),
            query=split.query,
            range=self.headers.get("Range"),
            status=status,
            sent_bytes=self._sent,
            authorization=self.headers.get("Authorization") is not None,
            interrupted=self._interrupted,
        ))

    def _send(self, status: int, body: bytes = b"", headers: Mapping[str, str] | None = None,
              head: bool = False, content_type: str = "application/json") -> int:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)
            self._sent += len(body)
        return status

    def _error(self, status: int, code: str | None, message: str, head: bool,
               extra: Mapping[str, str] | None = None) -> int:
        headers = {"X-Error-Message": message, **(extra or {})}
        if code is not None:
            headers["X-Error-Code"] = code
        return self._send(status, json.dumps({"error": message}).encode(), headers, head=head)

    def _bearer(self) -> str | None:
        value = self.headers.get("Authorization")
        if value and value.lower().startswith("bearer "):
            return value[7:].strip()
        return None

    def _repo_or_error(self, repo_id: str, head: bool) -> _Repo | int:
        with self.fake_hub._lock:
            repo = self.fake_hub._repos.get(repo_id)
        if repo is None:
            status = 404 if self._bearer() else 401  # the Hub answers 401 to anonymous requests for unknown repos
            return self._error(status, "RepoNotFound", "Repository not found", head)
        return repo

    # -- routes ------------------------------------------------------------------------------------------------
    def _route(self, head: bool) -> int:
        parts = self._raw_path.strip("/").split("/")
        if parts == ["api", "models"]:
            return self._list_models(head)
        if len(parts) >= 4 and parts[0] == "api" and parts[1] == "models":
            return self._api_models(parts[2:], head)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(f"{unquote(parts[0])}/{unquote(parts[1])}", parts[3:], head)
        return self._error(404, None, "Not found", head)

    def _api_models(self, parts: list[str], head: bool) -> int:
        repo_or_status = self._repo_or_error(f"{unquote(parts[0])}/{unquote(parts[1])}", head)
        if isinstance(repo_or_status, int):
            return repo_or_status
        repo = repo_or_status
        rest = parts[2:]
        if not rest:
            return self._model_info(repo, "main", head)
        if rest[0] == "revision" and len(rest) == 2:
            return self._model_info(repo, unquote(rest[1]), head)
        if rest[0] == "tree" and len(rest) >= 2:
            return self._tree(repo, unquote(rest[1]), unquote("/".join(rest[2:])), head)
        return self._error(404, None, "Not found", head)

    def _revision_or_error(self, repo: _Repo, revision: str, head: bool) -> _Revision | int:
        found = repo.find(revision)
        if found is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
        return found

    def _entries(self, revision: _Revision) -> dict[str, _FileEntry]:
        return {name: _FileEntry(name, path.read_bytes()) for name, path in _files_of(revision.folder).items()}

    def _model_info(self, repo: _Repo, revision_name: str, head: bool) -> int:
        revision = self._revision_or_error(repo, revision_name, head)
        if isinstance(revision, int):
            return revision
        with_blobs = self._query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for name, entry in self._entries(revision).items():
            sibling: dict[str, Any] = {"rfilename": name}
            if with_blobs:
                sibling.update(size=len(entry.data), blobId=entry.git_sha1)
                if entry.is_lfs:
                    sibling["lfs"] = {"sha256": entry.sha256, "size": len(entry.data),
                                      "pointerSize": _LFS_POINTER_SIZE}
            siblings.append(sibling)
        body = {
            "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": revision.commit,
            "lastModified": "2025-01-01T00:00:00.000Z",
            "createdAt": "2025-01-01T00:00:00.000Z",
            "private": False,
            "gated": "manual" if repo.gated_token else False,
            "disabled": False,
            "tags": [],
            "downloads": 0,
            "likes": 0,
            "siblings": siblings,
        }
        return self._send(200, json.dumps(body).encode(), head=head)

    def _tree(self, repo: _Repo, revision_name: str, folder: str, head: bool) -> int:
        revision = self._revision_or_error(repo, revision_name, head)
        if isinstance(revision, int):
            return revision
        recursive = self._query.get("recursive", ["false"])[0].lower() == "true"
        folder = folder.strip("/")
        entries = self._entries(revision)
        listed: dict[str, dict[str, Any]] = {}
        for name, entry in entries.items():
            if folder and not name.startswith(folder + "/"):
                continue
            relative = name[len(folder) + 1:] if folder else name
            pieces = relative.split("/")
            # Folders on the way to the file.
            for depth in range(1, len(pieces)):
                if not recursive and depth > 1:
                    break
                directory = posixpath.join(folder, *pieces[:depth]) if folder else "/".join(pieces[:depth])
                listed.setdefault(directory, {"type": "directory", "oid": hashlib.sha1(directory.encode()).hexdigest(),
                                              "path": directory})
            if recursive or len(pieces) == 1:
                item: dict[str, Any] = {"type": "file", "oid": entry.git_sha1, "size": len(entry.data), "path": name}
                if entry.is_lfs:
                    item["lfs"] = {"oid": entry.sha256, "size": len(entry.data), "pointerSize": _LFS_POINTER_SIZE}
                listed[name] = item
        if folder and not listed:
            return self._error(404, "EntryNotFound", f"{folder} does not exist on {revision_name}", head,
                               {"X-Repo-Commit": revision.commit})
        return self._send(200, json.dumps(list(listed.values())).encode(), head=head)

    def _resolve(self, repo_id: str, parts: list[str], head: bool) -> int:
        repo_or_status = self._repo_or_error(repo_id, head)
        if isinstance(repo_or_status, int):
            return repo_or_status
        repo = repo_or_status
        revision_name = unquote(parts[0])
        path_parts = parts[1:]
        if revision_name == "refs" and len(parts) >= 4 and parts[1] == "pr":
            revision_name, path_parts = f"refs/pr/{parts[2]}", parts[3:]
        filename = unquote("/".join(path_parts))
        revision = self._revision_or_error(repo, revision_name, head)
        if isinstance(revision, int):
            return revision
        if repo.gated_token is not None:
            token = self._bearer()
            if token is None:
                return self._error(401, "GatedRepo", f"Access to model {repo.repo_id} is restricted. You must have "
                                   "access to it and be authenticated to access it. Please log in.", head)
            if token != repo.gated_token:
                return self._error(403, "GatedRepo", f"Access to model {repo.repo_id} is restricted and you are "
                                   "not in the authorized list.", head)
        files = _files_of(revision.folder)
        if filename not in files:
            return self._error(404, "EntryNotFound", "Entry not found", head, {"X-Repo-Commit": revision.commit})
        entry = _FileEntry(filename, files[filename].read_bytes())
        return self._serve_file(entry, revision.commit, head)

    def _serve_file(self, entry: _FileEntry, commit: str, head: bool) -> int:
        size = len(entry.data)
        headers = {
            "ETag": f'"{entry.etag}"',
            "X-Repo-Commit": commit,
            "Accept-Ranges": "bytes",
            "Content-Disposition": f'inline; filename*=UTF-8\'\'{quote(posixpath.basename(entry.path))}',
        }
        if entry.is_lfs:
            headers["X-Linked-Size"] = str(size)
            headers["X-Linked-Etag"] = f'"{entry.sha256}"'
        range_header = self.headers.get("Range")
        start, end, status = 0, size - 1, 200
        if range_header is not None:
            parsed = _parse_range(range_header, size)
            if parsed is None:
                return self._send(416, b"", {**headers, "Content-Range": f"bytes */{size}"}, head=head,
                                  content_type="application/octet-stream")
            start, end = parsed
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        body = entry.data[start:end + 1]
        headers["Content-Length"] = str(len(body))

        interruption = self._take_interruption(entry.path) if not head else None
        if interruption is not None:
            return self._send_cut_off(status, body, headers, hold=interruption.then == "hold")
        if not head and self._fails_after_interruption(entry.path):
            return self._error(503, None, "Service unavailable (simulated outage after an interrupted download)",
                               head)
        return self._send(status, body, headers, head=head, content_type="application/octet-stream")

    def _take_interruption(self, filename: str) -> _Interruption | None:
        """The pending interruption of ``filename``'s next full GET (now taken), or None."""
        with self.fake_hub._lock:
            interruption = self.fake_hub._interruptions.get(filename)
            if interruption is None or interruption.cut:
                return None
            interruption.cut = True
            self._cut_after = interruption.after_bytes
            return interruption

    def _fails_after_interruption(self, filename: str) -> bool:
        with self.fake_hub._lock:
            interruption = self.fake_hub._interruptions.get(filename)
            return interruption is not None and interruption.cut and interruption.then == "fail"

    def _send_cut_off(self, status: int, body: bytes, headers: Mapping[str, str], hold: bool = False) -> int:
        """Promise the whole body, send part of it, then drop the connection (a network cut mid-download) — or, with
        ``hold``, wait for ``release_held()`` and send the rest (a slow link)."""
        keep = self._cut_after if self._cut_after is not None else len(body) // 2
        keep = max(0, min(keep, len(body) - 1))
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body[:keep])
        self.wfile.flush()
        self._sent += keep
        if hold:
            self.fake_hub._released.wait(HOLD_SECONDS)
            self.wfile.write(body[keep:])
            self._sent += len(body) - keep
            return status
        self._interrupted = True
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        return status

    # -- the model listing (``python -m h3app search``) -----------------------------------------------------------
    def _list_models(self, head: bool) -> int:
        """``HfApi.list_models``: ``filter`` (every value a tag of the repo), ``search`` (in the repo id, any case),
        ``sort`` (largest first, as the Hub; insertion order among equals), ``limit`` and ``expand`` (only those
        properties; ``siblings`` with ``rfilename`` only — the Hub's listing gives no sizes). One page, no ``Link``."""
        query = self._query
        filters = query.get("filter", []) + query.get("filter[]", [])
        search = (query.get("search", [""])[0] or "").lower()
        sort = query.get("sort", [None])[0]
        if sort is not None and sort not in LISTING_SORTS:
            return self._error(400, None, f"Invalid sort: {sort}", head)
        expand = query.get("expand", []) + query.get("expand[]", [])
        hub = self.fake_hub
        with hub._lock:
            repos = list(hub._repos.values())
            cards = {repo_id: dict(card) for repo_id, card in hub._cards.items()}
        rows = []
        for repo in repos:
            card = cards.get(repo.repo_id, {"tags": [], "downloads": 0, "likes": 0,
                                            "lastModified": "2025-01-01T00:00:00.000Z"})
            if not all(f in card["tags"] for f in filters) or search not in repo.repo_id.lower():
                continue
            properties = {**card, "private": False, "gated": "manual" if repo.gated_token else False,
                          "sha": repo.revisions["main"].commit, "createdAt": "2025-01-01T00:00:00.000Z",
                          "siblings": [{"rfilename": name} for name in _files_of(repo.revisions["main"].folder)]}
            shown = expand or LISTING_DEFAULT
            rows.append({"_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24], "id": repo.repo_id,
                         **({"modelId": repo.repo_id} if not expand else {}),
                         **{name: properties[name] for name in shown if name in properties}})
        if sort is not None:
            rows.sort(key=lambda row: cards.get(row["id"], {}).get(sort, 0) or 0, reverse=True)
        limit = query.get("limit", [None])[0]
        if limit is not None:
            rows = rows[:int(limit)]
        return self._send(200, json.dumps(rows).encode(), head=head)



def _parse_range(value: str, size: int) -> tuple[int, int] | None:
    """One ``bytes=`` range → inclusive (start, end) clipped to the file, or None when unsatisfiable/multiple."""
    match = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", value)
    if match is None or (not match.group(1) and not match.group(2)):
        return None
    first, last = match.group(1), match.group(2)
    if not first:  # suffix range: the last N bytes
        length = int(last)
        if length == 0:
            return None
        return max(0, size - length), size - 1
    start = int(first)
    end = int(last) if last else size - 1
    if start >= size or end < start:
        return None
    return start, min(end, size - 1)

