"""``python -m h3app …``: the command line. Contract in docs/architecture.md: exit 0 on success, 2 on bad input with one
line on stderr, JSON on stdout with ``--json``. Each command lives in ``h3app/commands/<name>.py`` with
``add_parser(subparsers)`` (which sets ``run``) and imports its heavy dependencies inside ``run``; it prints through
``h3app/commands/output.py`` and never imports this module back. A flag's value is parsed by its argparse ``type``
(one of ``h3app/rules``' parsers) and checks across flags (or for the chosen model) by the command's ``check``
default, so a bad value is refused before torch (or the libraries :func:`quiet_libraries` configures) is imported."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn, Protocol

from .commands import check, diff, export, generate, grid, inspect, plan, search
from .errors import H3AppError
from .rules.choices import T2VA


class Command(Protocol):
    """A command module: ``add_parser`` adds its subcommand, whose defaults set ``run`` (``Namespace`` → exit
    status) and, where it has checks across flags, ``check`` (``Namespace`` → None, or H3AppError)."""

    def add_parser(self, sub: argparse._SubParsersAction) -> None: ...


# light modules: heavy imports inside each ``run``
COMMANDS: tuple[Command, ...] = (inspect, generate, check, export, grid, diff, plan, search)
LIGHT = ("inspect", "search")  # commands that never import torch: the libraries are not configured for them
# Warnings raised in these libraries' own modules are not the user's to act on; h3app's and any other stay visible.
QUIET_MODULES = r"(torch|diffusers|transformers)(\.|$)"


class _OneLineParser(argparse.ArgumentParser):
    """Argument errors are bad input: one line on stderr, exit 2, no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="python -m h3app", description="H3 LoRA Lab command line.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def quiet_libraries() -> None:
    """Keep stderr for our one-line errors: no progress bars or deprecation chatter from the libraries."""
    import os
    import warnings

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    for category in (FutureWarning, UserWarning):  # torch's deprecation and kernel-override notes, on every run
        warnings.filterwarnings("ignore", category=category, module=QUIET_MODULES)
    try:
        from diffusers.utils import logging as diffusers_logging
        from transformers.utils import logging as transformers_logging
    except ImportError:
        return
    diffusers_logging.set_verbosity_error()
    diffusers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()


def refuse_before_libraries(args: argparse.Namespace) -> None:
    """What can be refused before :func:`quiet_libraries` imports diffusers and transformers (~9 s more on 2 cores),
    each by the rule the load applies again, for a command that loads the model here (generate, check, grid;
    ``app.py``): a ``--device`` this machine lacks (the loader's ``check_device``, torch
    alone imported) and, offline, a Hub ``--model`` the local cache does not hold (``repo.locate``)."""
    device = getattr(args, "device", None)
    if device is not None:
        from .model.loader import check_device

        check_device(device)
    model = getattr(args, "model", None)
    if model is None:
        return
    from .model import repo

    if repo.is_hub_repo(model):
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            repo.locate(model, getattr(args, "workflow", None) or T2VA, getattr(args, "model_revision", None),
                        os.environ.get("HF_TOKEN"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # a flag's ``type`` refuses a bad value with H3AppError's one line
        if getattr(args, "check", None) is not None:
            args.check(args)  # the command's checks across flags (or for its model), light too
        if args.command not in LIGHT:
            if getattr(args, "loads_model_here", False):  # set by add_model_flags (not plan's --device: a GPU box's)
                refuse_before_libraries(args)
            quiet_libraries()
        return int(args.run(args) or 0)
    except H3AppError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
