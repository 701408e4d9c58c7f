"""Running ``python -m h3app …`` from a test: in-process (fast, output captured by ``capsys``) or as a real
process (the exit status and streams a user sees; inherits the test's environment, its ``HF_HOME`` included)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import pytest

from h3app import cli

ROOT = Path(__file__).resolve().parents[1]


class CliResult(NamedTuple):
    code: int
    out: str
    err: str


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> CliResult:
    """``python -m h3app ARGV`` in this process: (exit code, stdout, stderr). argparse's ``SystemExit`` counts."""
    capsys.readouterr()
    try:
        code = cli.main(list(argv))
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    out, err = capsys.readouterr()
    return CliResult(code, out, err)


def run_cli_process(*argv: str, env: Mapping[str, str] | None = None,
                    timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m h3app ARGV`` as a child process in the repository root; ``env`` adds to this process's."""
    return subprocess.run([sys.executable, "-m", "h3app", *argv], cwd=ROOT, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line(text: str, pattern: str) -> str:
    """``text`` is exactly one ``error: …`` line (no traceback) that matches ``pattern`` (case-insensitive)."""
    lines = text.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got {len(lines)}:\n{text}"
    assert "Traceback" not in text
    line = lines[0]
    assert line.startswith("error: "), line
    assert re.search(pattern, line, re.IGNORECASE), f"{line!r} does not name the problem ({pattern!r})"
    return line
