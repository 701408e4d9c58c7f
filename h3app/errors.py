"""The one error type for problems a user can fix, and the one line a visitor gets for everything else."""

from __future__ import annotations

import logging
import traceback
import uuid

LOG = logging.getLogger("h3app")
MAX_LOGGED_MESSAGE = 500  # characters of an exception's message in the log: inputs can be megabytes


class H3AppError(Exception):
    """A user-facing problem, with a one-line message that names the problem and the fix.

    The CLI prints ``str(error)`` on one line and exits with status 2; the UI shows it as ``gr.Error``.
    Anything else that escapes is a bug in h3app.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class InternalError(H3AppError):
    """An unexpected failure, as a visitor sees it: one generic line with an id that finds the details in the
    server log (never the exception text, which may hold paths, library internals or the visitor's input)."""


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
