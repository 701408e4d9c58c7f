"""Why a request was refused: every "no" of the hosting room, worded in one place, each one line naming the limit.

A refusal is raised as :class:`Refused` (an ``H3AppError``) with its :class:`Reason`, so a caller, a log or a test
can tell which bound said no without reading the words. The bounds themselves are in ``limits.py``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from ..errors import H3AppError
from ..rules.units import format_bytes


class Reason(StrEnum):
    """Which bound refused (the value names it in logs)."""

    VISITOR_JOBS = "visitor GPU jobs"  # the visitor has its share of GPU jobs waiting or running
    SERVER_BUSY = "server GPU jobs"  # the admission is full
    VISITOR_REQUESTS = "visitor requests"  # the visitor has its share of cheap requests waiting or running
    WORKER_FULL = "worker line"  # the GPU worker's line is full
    UPLOAD_TOO_LARGE = "upload size"  # one upload over the adapter size cap
    VISITOR_UPLOADS = "visitor uploads"  # the visitor's upload copies would pass its quota
    UPLOAD_CACHE_FULL = "upload cache"  # Gradio's upload cache holds more than its cap
    UPLOADS_FULL = "uploads folder"  # the uploads folder would pass the total quota


def why_refused(reason: Reason, **facts: Any) -> str:
    """The one line a visitor reads for ``reason``; ``facts`` are the numbers it names (``limit``; bytes: ``used``,
    ``size``, ``quota``; ``name`` of an upload)."""
    limit = facts.get("limit")
    if reason is Reason.VISITOR_JOBS:
        return (f"you already have {limit} jobs waiting or running (at most {limit} per visitor): wait for one to "
                f"finish, or cancel it.")
    if reason is Reason.SERVER_BUSY:
        return f"the server is busy: {limit} jobs are waiting or running (its limit): try again in a minute."
    if reason is Reason.VISITOR_REQUESTS:
        return (f"you already have {limit} requests waiting or running (at most {limit} per visitor): wait for their "
                f"answers, then try again.")
    if reason is Reason.WORKER_FULL:
        return f"the queue is full ({limit} jobs waiting): try again in a minute."
    size, used, quota = (format_bytes(facts[k]) if k in facts else "" for k in ("size", "used", "quota"))
    if reason is Reason.UPLOAD_TOO_LARGE:
        return f"{facts['name']} is {size}, over this server's limit of {quota}: use a smaller adapter."
    if reason is Reason.VISITOR_UPLOADS:
        return (f"your uploads would take {used}, over this server's quota of {quota} per visitor: uploads are "
                f"deleted after an hour, or use a Hub repo instead.")
    if reason is Reason.UPLOAD_CACHE_FULL:
        return (f"the server's upload cache is full ({used} of {quota}): try again in an hour, or use a Hub repo "
                f"instead.")
    if reason is Reason.UPLOADS_FULL:
        return f"the server's uploads folder is full ({used} of {quota}): try again later, or use a Hub repo instead."
    raise ValueError(f"no wording for {reason!r}")


class Refused(H3AppError):
    """A request not admitted: ``reason`` names the bound (its message is :func:`why_refused`'s line)."""

    def __init__(self, reason: Reason, **facts: Any) -> None:
        self.reason, self.facts = reason, facts
        super().__init__(why_refused(reason, **facts))

    def __reduce__(self) -> tuple[Any, ...]:  # pickled whole (an error may cross processes: the ranks' channel)
        return _rebuild, (type(self), self.reason, self.facts)


def _rebuild(cls: type[Refused], reason: Reason, facts: dict[str, Any]) -> Refused:
    return cls(reason, **facts)
