"""The output folder: where a job's files go, what each mp4 records, and the one rule for local paths a visitor sees.

A hosted server's answers and files name files, never server folders (docs/security.md). The rule is written once,
:func:`names_only`: the UI applies it to every answer it shows a visitor, and :meth:`Outputs.record` to the settings
JSON a hosted server writes into its mp4s (those files go to visitors too). Result objects keep their files' full
paths (the UI serves those files itself); on a hosted server the settings they carry are the recorded ones.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .generation import GenerationResult, save_result
from .media import write_thumbnail

OUTPUT_KEEP_SECONDS = 3600
PATH_KEYS = frozenset({"out", "thumbnail", "video_path", "thumbnail_path", "baseline_video_path",
                       "baseline_thumbnail_path", "heatmap", "fallback_heatmap", "spectrogram_diff",
                       "fallback_spectrogram_diff", "first_frame", "last_frame", "references"})


MAX_DEPTH = 32  # nesting looked into (an answer can carry a visitor's own JSON)


def names_only(value: Any, depth: int = 0) -> Any:
    """``value`` (an answer or a settings JSON: dicts and lists) with every local path by its file name: the media
    and input files (``PATH_KEYS``) and the ``source`` of a local adapter's provenance (``"local": true``); repo
    ids and URLs stay as they are."""
    if depth > MAX_DEPTH:
        return value
    if isinstance(value, dict):
        local = value.get("local") is True
        return {key: _name(item) if key in PATH_KEYS or (key == "source" and local) else names_only(item, depth + 1)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(names_only(item, depth + 1) for item in value)
    return value


def _name(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_name(item) for item in value)
    return Path(value).name if isinstance(value, str) and value else value


@dataclass(frozen=True)
class GenerationOutput:
    """A finished generation: mp4 + thumbnail paths, the settings JSON stored in the mp4, and the raw result."""

    video_path: str
    thumbnail_path: str
    settings: dict[str, Any]
    result: GenerationResult

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {"out": self.video_path, "thumbnail": self.thumbnail_path, "seed": r.request.seed,
                "steps": r.request.steps, "evaluations": r.evaluations, "frames": r.frames, "fps": r.fps,
                "width": r.width, "height": r.height, "sample_rate": r.sample_rate,
                "audio_channels": int(r.audio.shape[0]), "hash": r.hash,
                "adapters": self.settings["adapters"], "seconds": round(r.seconds, 3), "cache": r.cache,
                **({"time": self.settings["time"]} if "time" in self.settings else {}),
                **({"zerogpu": self.settings["zerogpu"]} if "zerogpu" in self.settings else {})}


@dataclass(frozen=True)
class Outputs:
    """A folder for a job's files; ``hosted``: the settings each file records name local files by file name."""

    folder: Path
    hosted: bool = False

    def record(self, settings: dict[str, Any]) -> dict[str, Any]:
        """The settings JSON as an mp4 written here records it (and the result object keeps it)."""
        return names_only(settings) if self.hosted else settings

    def save_generation(self, result: GenerationResult, settings: dict[str, Any]) -> GenerationOutput:
        """``result`` as an mp4 (``settings`` recorded inside) and a thumbnail under a random name."""
        recorded = self.record(settings)
        stem = self.folder / uuid.uuid4().hex
        video = save_result(result, stem.with_suffix(".mp4"), recorded)
        thumb = write_thumbnail(stem.with_suffix(".png"), result.video)
        return GenerationOutput(str(video), str(thumb), recorded, result)


def remove_older(folders: Sequence[Path], keep_seconds: float, keep: Path) -> int:
    """Delete the files and folders in ``folders`` older than ``keep_seconds`` (never ``keep``); returns how many."""
    cutoff = time.time() - keep_seconds
    removed = 0
    for path in [entry for folder in folders for entry in folder.iterdir()]:
        try:
            if path == keep or path.lstat().st_mtime >= cutoff:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        except FileNotFoundError:  # removed by someone else meanwhile
            continue
        removed += 1
    return removed
