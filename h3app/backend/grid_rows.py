"""The grid's adapter rows: each given adapter is one row, and a folder or repo given with a glob weight name
(``*.safetensors``) is one row per matching file, in training order (``adapters.checkpoints``), each labelled with
its epoch, steps and trigger word. Only headers are read (remote: HTTP ranges), under the server's source policy."""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..adapters import source as sources
from ..adapters.checkpoints import is_glob, match_files, order_checkpoints
from ..errors import H3AppError
from ..rules import values
from ..settings import LoRASettings


@dataclass(frozen=True)
class GridRow:
    """One adapter row: its settings (alpha and strength set per cell) and its label (file name, epoch, steps,
    trigger)."""

    settings: LoRASettings
    label: str
    training: dict[str, Any] | None = None  # ``TrainingInfo.to_json()`` for a checkpoint found by a glob

    def to_json(self) -> dict[str, Any]:
        return {"source": self.settings.source, "weight_name": self.settings.weight_name, "label": self.label,
                "training": self.training}


def plain_label(settings: LoRASettings) -> str:
    """A row named by its file: the weight name's stem, else the source's last part."""
    name = settings.weight_name or str(settings.source).rstrip("/")
    return posixpath.splitext(posixpath.basename(name.replace("\\", "/")))[0] or str(settings.source)


def parse_row(text: str, mode: str) -> LoRASettings:
    """One row as the page's Grid tab takes it: ``SOURCE`` or ``SOURCE,weight=F,rev=R`` (``weight=*.safetensors``:
    a folder's or repo's files by a glob). The alpha and strength are the grid's axes."""
    source, *fields = [part.strip() for part in str(text).split(",")]
    given: dict[str, str] = {}
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep or key.strip() not in ("weight", "rev"):
            raise H3AppError(f"grid row {values.short(text)}: write SOURCE, or SOURCE,weight=FILE-or-GLOB,rev=R.")
        given[key.strip()] = value.strip()
    if not source:
        raise H3AppError("a grid row is empty: give a Hub repo id, an HF URL or a local path.")
    return LoRASettings(source=source, weight_name=given.get("weight") or None, revision=given.get("rev") or None,
                        mode=mode)


def expand_rows(policy: Any, adapters: Sequence[LoRASettings], token: str | None, max_rows: int) -> list[GridRow]:
    """``adapters`` as rows: a glob weight name expands into the files it matches, ordered by training progress;
    the others are one row each. Refused in one line past ``max_rows`` (the glob's refusal names the limit)."""
    rows: list[GridRow] = []
    for settings in adapters:
        if not is_glob(settings.weight_name):
            rows.append(GridRow(settings, plain_label(settings)))
            continue
        pattern = str(settings.weight_name)
        policy.check_source(settings.source)
        send = policy.token(token)
        files = sources.list_weight_files(settings.source, settings.revision, send, **policy.local_rule())
        names = match_files([f.name for f in files], pattern, f"{settings.source}", max_rows)

        def metadata(name: str, settings: LoRASettings = settings, send: str | bool | None = send) -> dict[str, str]:
            view = sources.read_header(settings.source, name, settings.revision, send, **policy.local_rule())
            return dict(view.metadata)

        for checkpoint in order_checkpoints(names, metadata):
            rows.append(GridRow(dataclasses.replace(settings, weight_name=checkpoint.weight_name), checkpoint.label,
                                checkpoint.training.to_json()))
    if len(rows) > max_rows:
        raise H3AppError(f"the grid has {len(rows)} adapter rows, more than the {max_rows} rows a grid may have on "
                         "this server: give fewer adapters.")
    return rows
