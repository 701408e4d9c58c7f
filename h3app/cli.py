"""``python -m h3app …``: the command line. Contract in docs/architecture.md: exit 0 on success, 2 on bad input with one
line on stderr, JSON on stdout with ``--json``. Each command lives in ``h3app/commands/<name>.py`` with
``add_parser(subparsers)`` (which sets ``run``) and imports its heavy dependencies inside ``run``."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from typing import Any

from .errors import H3AppError

COMMANDS = ("inspect", "generate", "check", "export", "grid", "plan", "search")


class _OneLineParser(argparse.ArgumentParser):
    """Argument errors are bad input: one line on stderr, exit 2, no usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="python -m h3app", description="H3 LoRA Lab command line.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    for name in COMMANDS:
        importlib.import_module(f"h3app.commands.{name}").add_parser(sub)
    return parser


def emit(result: dict[str, Any], as_json: bool, summary: str) -> None:
    """Print ``result`` as one JSON object (``--json``) or the human ``summary``."""
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=False, default=str))
    else:
        print(summary)


def quiet_libraries() -> None:
    """Keep stderr for our one-line errors: no progress bars or deprecation chatter from the libraries."""
    import os
    import warnings

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    try:
        from diffusers.utils import logging as diffusers_logging
        from transformers.utils import logging as transformers_logging
    except ImportError:
        return
    diffusers_logging.set_verbosity_error()
    diffusers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "check", None) is not None:
            args.check(args)  # a command's value checks: refused before any heavy library is imported
        if args.command not in ("inspect", "search"):  # these stay light: no torch-heavy imports
            quiet_libraries()
        return int(args.run(args) or 0)
    except H3AppError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
