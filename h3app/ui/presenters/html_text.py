"""The one escaping rule of the presenters: everything from a file or a person is HTML-escaped, quotes included
(an adapter header is untrusted input)."""

from __future__ import annotations

import html
from typing import Any


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)
