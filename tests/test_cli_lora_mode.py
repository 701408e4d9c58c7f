"""The CLI's LoRA-mode flag: ``--lora-mode`` on generate and grid (as ``plan`` names it), reaching the backend's
adapter settings; ``--mode`` stays a hidden alias there (scripts written before keep working), while ``check --mode``
is still the check's own mode."""

from __future__ import annotations

from typing import Any

import pytest
from cli_runner import run_cli

from h3app.backend import service
from h3app.cli import build_parser
from h3app.errors import H3AppError

TURBO = "assets/adapters/tiny_turbo_4step.safetensors"


class _Seen(H3AppError):
    """Raised by the stand-in backend once it has seen the job's adapters."""


class _StandInBackend:
    """Records the adapter settings a command hands to the backend, then stops the command (no model loaded)."""

    seen: list[Any] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def inspect(self, *args: Any, **kwargs: Any) -> Any:
        return type("Info", (), {"known": None})()

    def generate(self, request: Any, adapters: Any, token: Any = None, previews: Any = None) -> Any:
        _StandInBackend.seen = list(adapters)
        raise _Seen("seen")

    def plan_grid(self, *args: Any) -> None:
        return None

    def grid(self, request: Any, adapter: Any, *args: Any, previews: Any = None) -> Any:
        _StandInBackend.seen = [adapter]
        raise _Seen("seen")

    def close(self) -> None:
        pass


@pytest.mark.parametrize("command", ["generate", "grid"])
@pytest.mark.parametrize("flag", ["--lora-mode", "--mode"])
def test_the_lora_mode_flag_and_its_alias_reach_the_backend(command: str, flag: str, tmp_path: Any,
                                                            capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "Backend", _StandInBackend)
    out = ["--out", str(tmp_path / "x.mp4")] if command == "generate" else ["--out-dir", str(tmp_path)]
    result = run_cli(capsys, command, "--model", "tiny", "--prompt", "x", "--adapter", TURBO, flag, "merged", *out)
    assert result.code == 2 and result.err.strip().endswith("seen"), result.err
    assert [adapter.mode for adapter in _StandInBackend.seen] == ["merged"]


@pytest.mark.parametrize("command", ["generate", "grid"])
def test_lora_mode_is_the_documented_flag_and_mode_is_hidden(command: str) -> None:
    parser = build_parser()
    text = parser._subparsers._group_actions[0].choices[command].format_help()
    assert "--lora-mode {unmerged,merged}" in text and "--mode: deprecated alias" in text
    assert "--mode {" not in text
    target = ["--out", "x.mp4"] if command == "generate" else ["--out-dir", "d"]
    assert parser.parse_args([command, "--prompt", "x", "--adapter", TURBO, *target]).lora_mode == "unmerged"


def test_check_mode_is_still_the_checks_own() -> None:
    args = build_parser().parse_args(["check", "--adapter", TURBO, "--mode", "full"])
    assert args.mode == "full" and not hasattr(args, "lora_mode")
