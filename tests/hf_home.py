"""A private Hugging Face home per test: the environment *and* every copy of its paths made at import time.

huggingface_hub reads ``HF_HOME`` (and ``HF_HUB_CACHE``, ``HF_XET_CACHE``, token paths …) once, when
``huggingface_hub.constants`` is imported; some of its modules then copy a constant into their own namespace
(``utils/_cache_manager.py`` does ``from ..constants import HF_HUB_CACHE``: the default of ``scan_cache_dir()``),
and diffusers and transformers derive ``HF_MODULES_CACHE`` from it. Setting the environment variable during a test
changes none of these, so two tests would share one cache through them.

``use_hf_home`` remembers every home it was given (the session's, set in the environment before anything is
imported, then one per test): any module attribute whose value is a path under one of them is a copy of a
home-derived path, whoever made it and whenever (a module first imported during a test copies *that* test's home).
It finds them all, scanning each newly imported module of the libraries that read the cache once, and points them
at the test's own home.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path, PurePath
from typing import Any

import pytest

# Variables that would override HF_HOME for one location, or bring in a user's credentials: never inherited.
OVERRIDING_VARIABLES = (
    "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ASSETS_CACHE", "HUGGINGFACE_ASSETS_CACHE", "HF_XET_CACHE",
    "HF_MODULES_CACHE", "HF_TOKEN_PATH", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "TRANSFORMERS_CACHE",
    "DIFFUSERS_CACHE",
)
# Packages whose modules may hold an import-time copy of a cache path (h3app: in case it ever copies one).
SCANNED_PACKAGES = ("huggingface_hub", "diffusers", "transformers", "h3app")

SESSION_HOME = Path(tempfile.mkdtemp(prefix="h3app-test-hf-home-")).resolve()

_homes: set[str] = {str(SESSION_HOME)}  # every home used in this session (one per test: a set, looked up by parent)
_scanned: set[str] = set()
_copies: set[tuple[str, str]] = set()  # (module name, attribute) holding a path under one of ``_homes``


def isolate_process_environment() -> None:
    """Before any Hugging Face library is imported: the session home, offline, no user token or cache override."""
    SESSION_HOME.mkdir(parents=True, exist_ok=True)
    for name in OVERRIDING_VARIABLES:
        os.environ.pop(name, None)
    os.environ["HF_HOME"] = str(SESSION_HOME)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"


def _home_of(value: Any) -> Path | None:
    """The known home that ``value`` (a str or path) lies in (the innermost, if homes nest), else None. Looked up
    by the value's own path and its parents: the cost does not grow with the number of homes (one per test)."""
    if not isinstance(value, (str, PurePath)):
        return None
    text = os.fspath(value)
    if not text.startswith(os.sep) or "\n" in text:  # not an absolute path (most module strings)
        return None
    path = PurePath(text)
    for candidate in (path, *path.parents):
        if str(candidate) in _homes:
            return Path(candidate)
    return None


def _remember(home: Path) -> None:
    _homes.add(str(home))


def home_path_copies() -> set[tuple[str, str]]:
    """Every ``(module, attribute)`` among the loaded library modules that holds a path under a known home."""
    for name in [n for n in list(sys.modules) if n not in _scanned]:
        _scanned.add(name)  # every module is looked at once, whichever package it belongs to
        if name.split(".")[0] not in SCANNED_PACKAGES:
            continue
        module = sys.modules.get(name)
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attribute, value in list(namespace.items()):
            if _home_of(value) is not None:
                _copies.add((name, attribute))
    return set(_copies)


def _moved(value: Any, home: Path) -> Any:
    """``value`` (a path under a known home) re-rooted under ``home``, same type."""
    moved = home / Path(value).relative_to(_home_of(value))
    return str(moved) if isinstance(value, str) else type(value)(moved)


def _forget_clients() -> None:
    """A new home gets new Hub clients: huggingface_hub's one HTTP client (its pooled keep-alive connections could
    reach a stand-in Hub of an earlier test on a reused port) and the cached ``HfFileSystem`` instances (fsspec keeps
    one per arguments, each with its listings)."""
    if "huggingface_hub" not in sys.modules:
        return
    from huggingface_hub import close_session

    close_session()
    module = sys.modules.get("huggingface_hub.hf_file_system")
    if module is not None:
        module.HfFileSystem.clear_instance_cache()


def use_hf_home(monkeypatch: pytest.MonkeyPatch, home: str | Path) -> Path:
    """Point this process's Hugging Face libraries at ``home`` until ``monkeypatch`` undoes it: ``HF_HOME`` in the
    environment (subprocesses inherit it) and every import-time copy of a home-derived path."""
    home = Path(home).resolve()
    copies = home_path_copies()  # before ``home`` is known: nothing can lie under it yet
    _remember(home)
    _forget_clients()
    monkeypatch.setenv("HF_HOME", str(home))
    for name in OVERRIDING_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for module_name, attribute in sorted(copies):
        module = sys.modules.get(module_name)
        value = getattr(module, attribute, None)
        if module is not None and _home_of(value) is not None:
            monkeypatch.setattr(module, attribute, _moved(value, home))
    return home
