"""``python -m h3app search [QUERY] [--sort downloads|likes|updated] [--limit N] [--json]``: the MiniMax-H3 adapters
on the Hugging Face Hub (contract in docs/cli.md).

One listing call filtered by the base model's adapter tag, then one size request per listed repo with a weight file
(``adapters/source/search.py`` says why). Offline (``HF_HUB_OFFLINE=1``) or with the Hub out of reach: one line,
exit status 2. A file is checked before download with ``python -m h3app inspect REPO --weight-name FILE``.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..adapters.source.search import DEFAULT_LIMIT, DEFAULT_SORT, MAX_LIMIT, SORTS


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="list MiniMax-H3 adapters on the Hugging Face Hub")
    p.add_argument("query", nargs="?", default=None, help="narrow to repo ids containing this text")
    p.add_argument("--sort", default=DEFAULT_SORT, choices=list(SORTS),
                   help="most downloads (default), most likes, or latest change first")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help=f"at most N results, 1 to {MAX_LIMIT}")
    p.add_argument("--json", action="store_true", help='print one JSON object: {"results": [...]}')
    p.set_defaults(run=run)


def summary(results: list[dict[str, Any]]) -> str:
    """One block per repo: its numbers, then each weight file with its size, known preset and recommendation."""
    from ..rules.units import format_bytes

    if not results:
        return "no MiniMax-H3 adapters found on the Hub for this search."
    lines = []
    for result in results:
        gated = " · gated (accept its terms, then use a token)" if result["gated"] else ""
        updated = (result["updated"] or "?")[:10]
        lines.append(f"{result['repo_id']}  ↓{result['downloads']:,} ♥{result['likes']:,} updated {updated}{gated}")
        if not result["files"]:
            lines.append("    no .safetensors file")
        for file in result["files"]:
            known = result["known"].get(file["name"])
            mark = "★ " if file["name"] == result["recommended"] else "  "
            preset = f"  [{known['title']}]" if known else ""
            lines.append(f"  {mark}{file['name']}  {format_bytes(file['size'])}{preset}")
    lines.append("★ the registry's recommended file · check one before download: "
                 "python -m h3app inspect REPO --weight-name FILE")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..adapters.catalog import result_json
    from ..adapters.source.search import search_adapters
    from .output import emit

    found = search_adapters(args.query, sort=args.sort, limit=args.limit)
    results = [result_json(r) for r in found]
    emit({"results": results}, args.json, summary(results))
    return 0
