"""The start-up check of h3app's private-API doors (``model.diffusers_compat``, ``model.torch_compat``,
``ui.gradio_compat``): each was written
against one version of its library (the pin in requirements.txt) and refuses any other in one line, at import,
before anything reaches a private name that may have moved."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from ..errors import H3AppError


def installed(package: str) -> str:
    """The installed version of ``package`` as pip records it (``2.14.1+cu130``), or ``"none"``."""
    try:
        return version(package)
    except PackageNotFoundError:
        return "none"


def release(version_string: str) -> str:
    """``version_string`` without its local build label: ``2.14.1+cu130`` → ``2.14.1`` (a CUDA or CPU build of one
    release has the same Python API)."""
    return version_string.split("+", 1)[0]


def check_written_for(package: str, written_for: str, door: str) -> None:
    """Refuse (``H3AppError``, one line) unless the installed ``package`` is release ``written_for``."""
    found = installed(package)
    if release(found) != written_for:
        raise H3AppError(f"{door} uses private parts of {package} {written_for} (the pin in requirements.txt), but "
                         f"{package} {found} is installed: install {package}=={written_for} "
                         f"(pip install -r requirements.txt), or port {door} to {found}.")
