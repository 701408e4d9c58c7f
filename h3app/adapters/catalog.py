"""Hub search results as the app shows them: each repo with what the known-adapter registry says of its files, the
file the registry recommends, and the one-line verdict of a file's check before download.

- ``known``: file name → the registry entry's settings (``KnownAdapter.to_json``: steps, shifts, alpha, workflow,
  trigger, scale, notes), for the files the registry knows.
- ``recommended``: the registry lists a repo's files most specific first, and a repo's preferred files ahead of its
  others (Larry's v4 before its older 4-step files). The recommended file is the one whose registry entry comes
  first among the entries for the workflow asked (an entry without a workflow serves every workflow); when several
  files share that entry, or the registry knows none of them, no file is recommended.
- A check is the inspection of the file's header (HTTP range reads, nothing downloaded): ``✓ loads`` with format,
  rank, alpha and its source, and how many of the model's layers it targets; ``✗`` and the one-line reason when it
  would be refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..rules.choices import T2VA
from .known import KNOWN_ADAPTERS, find_known
from .source.search import HubAdapter, HubFile

LOADS, REFUSED = "✓", "✗"


def known_files(repo_id: str, files: Sequence[HubFile]) -> dict[str, dict[str, Any]]:
    """File name → its registry settings, for the files of ``repo_id`` the registry knows."""
    known = {f.name: find_known(repo_id, f.name) for f in files}
    return {name: entry.to_json() for name, entry in known.items() if entry is not None}


def recommended_file(repo_id: str, files: Sequence[HubFile], workflow: str = T2VA) -> str | None:
    """The file the registry recommends for ``workflow`` (see the module docstring), or None."""
    ranked: dict[int, list[str]] = {}
    for file in files:
        entry = find_known(repo_id, file.name)
        if entry is not None and entry.workflow in (None, workflow):
            ranked.setdefault(KNOWN_ADAPTERS.index(entry), []).append(file.name)
    if not ranked:
        return None
    first = ranked[min(ranked)]
    return first[0] if len(first) == 1 else None


def result_json(result: HubAdapter, workflow: str = T2VA) -> dict[str, Any]:
    """One search result: ``HubAdapter.to_json`` plus ``known`` and ``recommended``."""
    return {**result.to_json(), "known": known_files(result.repo_id, result.files),
            "recommended": recommended_file(result.repo_id, result.files, workflow)}


@dataclass(frozen=True)
class FileCheck:
    """A file's check before download: ``ok`` (it would load), ``line`` (what the person reads)."""

    ok: bool
    line: str

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "line": self.line}


def passed(info: Mapping[str, Any]) -> FileCheck:
    """The verdict on an inspected file (``AdapterInfo.to_json``): it loads when any target names a layer of the
    model; keys that match nothing are counted."""
    targets = int(info.get("num_targets") or 0)
    unmatched = len(info.get("unmatched_keys") or ())
    if targets == 0:
        return FileCheck(False, f"{REFUSED} matches no layer of this model ({unmatched} keys matched nothing)")
    rank = info.get("rank")
    ranks = sorted(set((info.get("ranks") or {}).values()))
    alpha = info.get("alpha")
    alphas = sorted(set((info.get("alphas") or {}).values()))
    rank_text = f"rank {rank}" if rank is not None else "ranks " + "/".join(str(r) for r in ranks)
    alpha_text = (f"alpha {alpha:g}" if alpha is not None else "alphas " + "/".join(f"{a:g}" for a in alphas))
    ignored = f", {unmatched} keys ignored" if unmatched else ""
    return FileCheck(True, f"{LOADS} loads: {info.get('format')}, {rank_text}, {alpha_text} "
                           f"({info.get('alpha_source')}), {targets} targets{ignored}")


def refused(message: str) -> FileCheck:
    """The verdict on a file the check refused with ``message`` (an ``H3AppError`` line)."""
    return FileCheck(False, f"{REFUSED} {message}")


__all__ = ["FileCheck", "known_files", "passed", "recommended_file", "refused", "result_json"]
