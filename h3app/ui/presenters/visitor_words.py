"""The page's words for what the backend words for the command line: flags, environment variables and commands.

The backend's one-line refusals are shared by the CLI and the page (one message per problem), and the CLI's fix is
often a flag ("give --first-frame and/or --last-frame") or a server setting ("unset HF_HUB_OFFLINE"). A page visitor
has controls, not flags, and cannot set the server's environment, so every message the page shows passes through
:func:`visitor_text`: a flag becomes the control that sets it, a server setting becomes what it means for the
visitor, a command becomes "the command line". The CLI and the docs keep the flags. :func:`counted` writes a count
with its noun in the right number ("1 cell", "2 cells").
"""

from __future__ import annotations

import re

from ...settings import KNOBS

# Server settings, as what they mean to a visitor (most specific first). The server's environment is not theirs.
_SERVER = (
    (r",? ?and HF_HUB_OFFLINE=1 is set: unset HF_HUB_OFFLINE to search, or ", ", and this server is offline: "),
    (r" and HF_HUB_OFFLINE=1: unset HF_HUB_OFFLINE to download it, or fetch it once while online\.?",
     " and this server is offline: pick a demo adapter or upload the file."),
    (r" ?\(HF_HUB_OFFLINE=1\)", ""),
    (r" ?\(or HF_ENDPOINT\)", ""),
    (r" or HF_ENDPOINT=[^)\s]+", ""),
    (r"set HF_TOKEN or paste a token", "paste a token (Hugging Face token, under the adapter)"),
    (r"point H3APP_\w+ at a disk with room", "ask the server's operator for more disk"),
    (r"`?python -m h3app[\w. ]*`?", "the command line"),
)
# Flags the page has a control for (the flag with its value first, then the bare flag).
_CONTROLS = (
    ("--first-frame and/or --last-frame", "a First and/or Last keyframe"),
    ("--reference FILE", "a file under References"),
    ("--workflow fl2va", "pick the fl2va workflow"), ("--workflow ref2va", "pick the ref2va workflow"),
    ("--height and --width", "Height and Width"), ("--lora-mode unmerged", "LoRA mode unmerged"),
    ("--weight-name folder/file.safetensors", "the file in Weight file"), ("--weight-name", "Weight file"),
    ("--revision", "Revision"), ("--lora-mode", "LoRA mode"), ("--scale", "Scale"), ("--cache", "Step cache"),
    *((knob.flag, knob.label) for knob in KNOBS), ("--height", "Height"), ("--width", "Width"),
    ("--workflow", "Workflow"), ("--mode full", "the full check"),
    ("--offload auto", "a smaller request"), ("--offload", "a smaller request"),
)
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)")


def visitor_text(message: str) -> str:
    """``message`` in a page visitor's words: no ``--flag``, no environment variable, no ``python -m``. A flag with
    no control on the page becomes "the command line's *name* option" (a CLI choice the page does not offer)."""
    text = str(message)
    for pattern, words in _SERVER:
        text = re.sub(pattern, words, text)
    for flag, control in _CONTROLS:
        text = re.sub(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", control, text)
    return _FLAG.sub(lambda found: f"the command line's {found.group(1).replace('-', ' ')} option", text)


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``1 cell``, ``2 cells``, ``0 seeds`` (``plural``: the noun's plural when it is not noun + s)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
