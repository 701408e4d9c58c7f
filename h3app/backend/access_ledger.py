"""Who was shown, online, to be allowed to read a Hub adapter file: what a hosted server that cannot ask the Hub
(``HF_HUB_OFFLINE=1``) goes by, so that "gated" stays gated offline.

Online, every hosted job asks the Hub with its own token whether it may read the file (``hub.check_access``); each
answer that says yes is recorded here under (repo, file, commit) and the token's SHA-256 (never the token), or under
no token when the file opened without one (public: anyone may use it). Offline, a cached file is served only to a
request that matches such a record: a public file to anyone, a gated or private one to the same token again. A file
never checked in this process — say, a cache filled before an offline start — is refused, since nothing says who may
read it. The records live in memory only and end with the process.
"""

from __future__ import annotations

import hashlib
import threading

from ..errors import H3AppError

PUBLIC = "public"


def token_key(token: str | bool | None) -> str:
    """The ledger's key for ``token``: its SHA-256, or ``PUBLIC`` for no token."""
    return hashlib.sha256(token.encode()).hexdigest() if isinstance(token, str) and token else PUBLIC


class AccessLedger:
    """(repo, file, commit) → the token keys shown allowed online (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._allowed: dict[tuple[str, str, str | None], set[str]] = {}

    def record(self, repo_id: str, filename: str, commit: str | None, token: str | bool | None) -> None:
        with self._lock:
            self._allowed.setdefault((repo_id, filename, commit), set()).add(token_key(token))

    def check_offline(self, repo_id: str, filename: str, commit: str | None, token: str | bool | None) -> None:
        """Refuse, in one line, a request no online check has shown allowed to read the file."""
        with self._lock:
            allowed = self._allowed.get((repo_id, filename, commit), set())
        if PUBLIC in allowed or token_key(token) in allowed:
            return
        raise H3AppError(f"{repo_id}/{filename} cannot be checked: this server is offline (HF_HUB_OFFLINE=1) and "
                         f"cannot ask the Hub who may read it, so it serves only files it has seen opened without a "
                         f"token, or with your token: use it again, or a demo adapter, an upload, or try later.")
