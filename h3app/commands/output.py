"""What a command prints on success: one JSON object (``--json``) or its human summary. Imported by the commands
(never ``h3app.cli``, which imports the commands: no import circle)."""

from __future__ import annotations

import json
from typing import Any


def emit(result: dict[str, Any], as_json: bool, summary: str) -> None:
    """Print ``result`` as one JSON object (``--json``) or the human ``summary``."""
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=False, default=str))
    else:
        print(summary)
