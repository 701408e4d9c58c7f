"""Which adapter uploads a server takes and where it keeps them: the decision, apart from how the UI receives files.

An upload is accepted only as ``.safetensors`` (pickles can run code) and, on a hosted server, only up to the size
cap of a remote adapter. Each accepted upload goes into its own folder with a random name inside the backend's
uploads folder (``upload-<12 hex>/<name>``). Who may read it: anyone who names its path (an allowed local folder),
but nobody may list the uploads folder (``SourcePolicy.check_source``), so a visitor reaches only their own files.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..adapters.source import WEIGHT_SUFFIX
from ..errors import H3AppError
from .refusals import Reason, Refused

UPLOAD_PREFIX = "upload-"


@dataclass(frozen=True)
class UploadPolicy:
    """The uploads of one server: ``folder`` holds them, ``max_bytes`` caps each (None: no cap)."""

    folder: Path
    max_bytes: int | None = None

    @classmethod
    def of(cls, policy: Any, folder: str | Path) -> UploadPolicy:
        """Hosted servers cap an upload like a remote adapter; local ones take any size (``policy``: the backend's
        ``SourcePolicy``)."""
        return cls(Path(folder), policy.max_remote_bytes if policy.hosted else None)

    def check_name(self, name: str) -> None:
        """Refuse, in one line, an upload that is not ``.safetensors`` (before its bytes are looked at)."""
        if Path(name).suffix.lower() != WEIGHT_SUFFIX:
            raise H3AppError(f"{name} is not a .safetensors file: only .safetensors adapters can be uploaded "
                             "(pickles can run code).")

    def check_size(self, name: str, size: int) -> None:
        """Refuse, in one line, an upload over the cap."""
        if self.max_bytes is not None and size > self.max_bytes:
            raise Refused(Reason.UPLOAD_TOO_LARGE, name=name, size=size, quota=self.max_bytes)

    def destination(self, name: str) -> Path:
        """A new path for an accepted upload named ``name``, in a folder of its own that nobody can guess."""
        folder = self.folder / f"{UPLOAD_PREFIX}{uuid.uuid4().hex[:12]}"
        folder.mkdir(parents=True)
        return folder / Path(name).name
