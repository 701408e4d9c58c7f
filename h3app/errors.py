"""The one error type for problems a user can fix."""


class H3AppError(Exception):
    """A user-facing problem, with a one-line message that names the problem and the fix.

    The CLI prints ``str(error)`` on one line and exits with status 2; the UI shows it as ``gr.Error``.
    Anything else that escapes is a bug in h3app.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))
