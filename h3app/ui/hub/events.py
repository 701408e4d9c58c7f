"""The "Find on the Hub" panel's events: search the Hub for MiniMax-H3 adapters, pick a file into an adapter slot,
check files before download. Each method takes plain values and returns a small view; nothing is downloaded here
(the pick's preview and every check read headers by HTTP range requests).

Hosted mode: a search is answered from a cache for ``SEARCH_CACHE_SECONDS`` (keyed by the query, sort, workflow
and the visitor's token digest, so one visitor's access never answers for another's); a visitor's own token is
sent for gated repos, never the server's (``SourcePolicy.token``); the panel's events are cheap events, bounded per
visitor like the others (``hosting/join_bound.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gradio as gr
import pandas as pd

from ...adapters.catalog import FileCheck, passed, refused, result_json
from ...adapters.source.search import DEFAULT_LIMIT, DEFAULT_SORT, RecentSearches, search_adapters
from ...backend.access_ledger import token_key
from ...errors import H3AppError
from ...rules.choices import T2VA
from ...rules.units import format_bytes
from ..forms import KEEP
from ..presenters import render
from ..presenters.visitor_words import visitor_text
from ..user_error import user_error

if TYPE_CHECKING:
    from ...backend.service import Backend

SEARCH_CACHE_SECONDS = 300  # hosted: how long one search answers again without asking the Hub
MAX_CHECKS = 12  # files one "Check" press reads (each: one listing and a few range reads)
COLUMNS = ["repo", "file", "size", "downloads", "likes", "updated", "known preset", "check"]
COLUMN_WIDTHS: list[str | int] = ["16%", "21%", "7%", "8%", "5%", "8%", "14%", "21%"]
GATED = "gated · "  # the repo cell of a gated repo (text: an emoji lock is missing from some fonts)
NO_FILE = "—"  # the file cell of a repo without a .safetensors file
RECOMMENDED = "★ "


@dataclass(frozen=True)
class SearchView:
    """What a search shows: the table, the rows behind it (one per weight file) and the line above it."""

    rows: list[dict[str, Any]]
    table: Any
    note: str


@dataclass(frozen=True)
class HubPick:
    """A picked row put in an adapter slot: its source, weight file (dropdown update), revision and demo pick."""

    source: Any = KEEP
    weight: Any = KEEP
    revision: Any = KEEP
    demo: Any = KEEP


def result_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per weight file of each result (``catalog.result_json``), one for a repo without any."""
    rows = []
    for result in results:
        files = result["files"] or [{"name": None, "size": None}]
        for file in files:
            known = result["known"].get(file["name"]) if file["name"] else None
            rows.append({"repo_id": result["repo_id"], "name": file["name"], "size": file["size"],
                         "downloads": result["downloads"], "likes": result["likes"], "updated": result["updated"],
                         "gated": result["gated"], "known": known["title"] if known else "",
                         "recommended": file["name"] is not None and file["name"] == result["recommended"],
                         "files": result["files"], "check": ""})
    return rows


def table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The results table: ★ marks the registry's recommended file, ``gated ·`` a gated repo."""
    return pd.DataFrame([[(GATED if r["gated"] else "") + r["repo_id"],
                          ((RECOMMENDED if r["recommended"] else "") + r["name"]) if r["name"] else NO_FILE,
                          format_bytes(r["size"]) if r["name"] else "", r["downloads"], r["likes"],
                          (r["updated"] or "")[:10], r["known"], r["check"]] for r in rows], columns=COLUMNS)


class HubEvents:
    """Event functions of the panel, bound to one backend (its policy decides the token and the local rule)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.cache = RecentSearches(SEARCH_CACHE_SECONDS) if backend.hosted else None

    def token(self, token: str | None) -> str | bool | None:
        """The token a Hub call sends: the visitor's; hosted, never the server's own."""
        return self.backend.policy.token((token or "").strip() or None)

    def search(self, query: str | None, sort: str = DEFAULT_SORT, token: str | None = None,
               workflow: str = T2VA, limit: int = DEFAULT_LIMIT) -> list[dict[str, Any]]:
        """The results (``catalog.result_json`` each), from the cache when hosted and fresh."""
        from huggingface_hub import constants

        sent = self.token(token)

        def search() -> list[dict[str, Any]]:
            return [result_json(r, workflow or T2VA) for r in search_adapters(query, sort=sort, limit=limit,
                                                                              token=sent)]

        key = (constants.ENDPOINT, (query or "").strip(), sort, limit, workflow, token_key(sent))
        try:
            return search() if self.cache is None else self.cache.get_or_search(key, search)
        except H3AppError as error:
            raise user_error(error) from error

    def search_view(self, query: str | None, sort: str = DEFAULT_SORT, token: str | None = None,
                    workflow: str = T2VA) -> SearchView:
        """Search and lay out; a refusal (offline, the Hub out of reach, a bad query) is the red line above."""
        try:
            results = self.search(query, sort, token, workflow)
        except gr.Error as error:
            return SearchView([], table([]), render.refusal(error.message))
        rows = result_rows(results)
        files = sum(1 for r in rows if r["name"])
        what = f" matching “{render.esc(query.strip())}”" if query and query.strip() else ""
        note = (f"{len(results)} MiniMax-H3 adapter repos{what}, {files} weight files · ★ the registry's recommended "
                "file · pick a row to preview it in adapter 1 (header only: nothing is downloaded until you run)"
                if results else f"No MiniMax-H3 adapters found on the Hub{what}.")
        return SearchView(rows, table(rows), render.card("info" if results else "plain", note, testid="hub-note"))

    def pick(self, rows: list[dict[str, Any]] | None, index: int) -> HubPick:
        """Row ``index`` into the slot: the repo as source, its files in the weight box with this one chosen."""
        row = _row(rows, index)
        if row["name"] is None:
            raise gr.Error(f"{row['repo_id']} has no .safetensors file: pick another result.", print_exception=False)
        choices = [(f"{f['name']} — {format_bytes(f['size'])}", f["name"]) for f in row["files"]]
        return HubPick(source=row["repo_id"], weight=gr.update(choices=choices, value=row["name"]), revision="",
                       demo=None)

    def check(self, repo_id: str, name: str, token: str | None = None, workflow: str = T2VA) -> FileCheck:
        """``repo_id``/``name`` checked against this model from its header alone (HTTP range reads)."""
        try:
            info = self.backend.inspect(repo_id, name, None, (token or "").strip() or None, workflow=workflow or T2VA)
        except H3AppError as error:
            return refused(visitor_text(str(error)))
        return passed(info.to_json())

    def check_rows(self, rows: list[dict[str, Any]] | None, token: str | None = None,
                   workflow: str = T2VA) -> SearchView:
        """Check the first ``MAX_CHECKS`` files not checked yet; their ✓/✗ line fills the check column."""
        rows = [dict(r) for r in rows or []]
        pending = [r for r in rows if r["name"] and not r["check"]][:MAX_CHECKS]
        for row in pending:
            row["check"] = self.check(row["repo_id"], row["name"], token, workflow).line
        left = sum(1 for r in rows if r["name"] and not r["check"])
        note = (f"checked {len(pending)} files from their headers" + (f"; {left} left: press Check again" if left
                                                                        else ""))
        return SearchView(rows, table(rows), render.card("info", note, testid="hub-note"))

    @staticmethod
    def mark(rows: list[dict[str, Any]] | None, index: int | None, info: dict[str, Any] | None,
             refusal: str | None) -> SearchView | None:
        """The picked row's check column from the slot's preview (its inspect info, or its refusal line)."""
        if not rows or index is None or not 0 <= index < len(rows):
            return None
        rows = [dict(r) for r in rows]
        rows[index]["check"] = refused(refusal).line if refusal else passed(info).line if info else ""
        return SearchView(rows, table(rows), KEEP)


def _row(rows: list[dict[str, Any]] | None, index: Any) -> dict[str, Any]:
    if not rows or not isinstance(index, int) or not 0 <= index < len(rows):
        raise gr.Error("that row is no longer in the results: search again.", print_exception=False)
    return rows[index]


__all__ = ["COLUMNS", "HubEvents", "HubPick", "SearchView", "result_rows", "table"]
