"""Argparse ``type``s for the commands' value flags: each parses with the one parser ``h3app/rules`` has for that
kind of value, while the arguments are read. A bad value is therefore refused (one line, exit 2: ``h3app/cli.py``
answers the ``H3AppError``) before any command imports torch. Light on purpose: ``rules`` only."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import H3AppError
from ..rules import values
from ..rules.check_pair import CheckSetting, parse_setting
from ..rules.frames import RELEASED


def dtype_name(text: str) -> str:
    """``--dtype``: ``float32``/``fp32``/``bfloat16``/``bf16`` → ``float32`` or ``bfloat16``."""
    return values.parse_dtype_name(text)


def duration_seconds(text: str) -> float:
    """``--duration``: seconds within the released frame rule's range."""
    return RELEASED.check_duration(values.parse_number(text, "--duration"), "--duration")


def mp4_path(text: str) -> str:
    """``--out`` of one video: a path ending in ``.mp4``."""
    if not text.endswith(".mp4"):
        raise H3AppError(f"--out must end in .mp4, got {values.short(text)}.")
    return text


def seed_list(text: str) -> list[int]:
    """``--seeds``: comma-separated whole numbers ≥ 0, at least one (the UI's grid parses them the same way)."""
    return values.parse_seeds(text, "--seeds")


def check_setting(flag: str) -> Callable[[str], CheckSetting]:
    """``--a``/``--b`` of ``check``: ``ALPHA:SCALE`` (ALPHA a number or ``auto``)."""

    def parse(text: str) -> CheckSetting:
        return parse_setting(text, flag)

    parse.__name__ = f"{flag.lstrip('-')}_setting"
    return parse
