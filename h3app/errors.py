"""The one-line reply: :class:`H3AppError` is every failure h3app answers in one line (most of them a problem the
user can fix), and :func:`for_visitor` turns anything else into :class:`InternalError`'s generic line for a visitor."""

from __future__ import annotations

import logging
import traceback
import uuid

LOG = logging.getLogger("h3app")
MAX_LOGGED_MESSAGE = 500  # characters of an exception's message in the log: inputs can be megabytes


class H3AppError(Exception):
    """A failure answered with one line and no traceback. Most are problems a user can fix, and the line names the
    problem and the fix (a bad input, a refused source, a limit); some say what happened and what to do next (a full
    queue, a cancel, a lost rank); :class:`InternalError` is the generic line a visitor gets for a bug.

    The CLI prints ``str(error)`` on one line and exits with status 2; the UI shows it as ``gr.Error``; every
    ``except H3AppError`` passes the line on as it is. Anything else that escapes is a bug in h3app.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class InternalError(H3AppError):
    """A bug, as a visitor sees it: one generic line with an id that finds the details in the server log (never the
    exception text, which may hold paths, library internals or the visitor's input). Nothing the user can fix: it is
    an :class:`H3AppError` only as a one-line reply, so that the UI shows it as is and never wraps it twice."""


def for_visitor(error: BaseException, where: str = "request") -> BaseException:
    """``error`` itself when it is an :class:`H3AppError` (or not an ``Exception``: interrupts stay what they are);
    else an :class:`InternalError` after logging the original, its message cut to ``MAX_LOGGED_MESSAGE``
    characters, with its traceback."""
    if isinstance(error, H3AppError) or not isinstance(error, Exception):
        return error
    error_id = uuid.uuid4().hex[:8]
    message = str(error)
    if len(message) > MAX_LOGGED_MESSAGE:
        message = message[:MAX_LOGGED_MESSAGE] + f"… ({len(message):,} characters)"
    LOG.error("%s failed [%s]: %s: %s\n%s", where, error_id, type(error).__name__, message,
              "".join(traceback.format_tb(error.__traceback__)).rstrip())
    internal = InternalError(f"something went wrong on the server (error {error_id}); the model is unchanged: try "
                             f"again, or report the error id.")
    internal.__cause__ = error
    return internal
