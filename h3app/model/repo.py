"""Where a model lives: ``tiny`` (the embedded checkpoint), a local folder, or a Hub repo id → a local folder.

Only the components a workflow needs are fetched (``allow_patterns``), and only the transformer partition it uses
(``transformer/`` for t2va and fl2va, ``transformer_ref/`` for ref2va): the real repo's partitions are 62 GB each.
``HF_HUB_OFFLINE``, ``HF_HOME``, ``HF_TOKEN`` and ``revision`` are honoured by huggingface_hub itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import H3AppError
from ..rules.choices import (
    MAIN_PARTITION,
    PARTITIONS,
    REAL_REPO_ID,
    REFERENCE_PARTITION,
    T2VA,
    check_workflow,
    workflow_partition,
)

TINY = "tiny"
TINY_DIR = Path(__file__).resolve().parents[2] / "assets" / "tiny-h3"
INDEX_FILE = "modular_model_index.json"
PIPELINE_CLASS = "MiniMaxH3ModularPipeline"

SHARED_COMPONENTS = (
    "text_encoder",
    "tokenizer",
    "processor",
    "scheduler",
    "audio_scheduler",
    "vae",
    "audio_vae",
)
EXPECTED_CLASSES = {
    MAIN_PARTITION: "MiniMaxH3Transformer3DModel",
    REFERENCE_PARTITION: "MiniMaxH3Transformer3DModel",
    "vae": "AutoencoderKLMiniMaxH3",
    "audio_vae": "AutoencoderKLMiniMaxH3Audio",
    "scheduler": "MiniMaxH3Scheduler",
    "audio_scheduler": "MiniMaxH3Scheduler",
    "text_encoder": "Qwen3VLForConditionalGeneration",
}
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def partition_for(workflow: str) -> str:
    """The transformer partition a workflow runs on."""
    check_workflow(workflow)
    return workflow_partition(workflow)


def components_for(workflow: str, with_text_encoder: bool = True) -> tuple[str, ...]:
    """Component folders a workflow needs (text encoder optional when prompt embeddings come from elsewhere)."""
    shared = SHARED_COMPONENTS if with_text_encoder else tuple(c for c in SHARED_COMPONENTS if c != "text_encoder")
    return (*shared, partition_for(workflow))


@dataclass(frozen=True)
class ModelLocation:
    """A model resolved to a local folder. ``repo_id``/``commit`` are set for Hub models."""

    name: str
    folder: Path
    repo_id: str | None = None
    revision: str | None = None
    commit: str | None = None


def _check_index(folder: Path, name: str, needed: tuple[str, ...]) -> None:
    index_path = folder / INDEX_FILE
    if not index_path.is_file():
        raise H3AppError(
            f"{name} is not a MiniMax H3 repo: it has no {INDEX_FILE}; point --model at a MiniMax H3 diffusers "
            f"folder or repo (e.g. {REAL_REPO_ID}) or use `tiny`."
        )
    try:
        index = json.loads(index_path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise H3AppError(f"{name}: {INDEX_FILE} is not valid JSON ({error}); re-download the model.") from error
    if index.get("_class_name") != PIPELINE_CLASS:
        raise H3AppError(
            f"{name} is not a MiniMax H3 repo: {INDEX_FILE} names {index.get('_class_name')!r}, expected "
            f"{PIPELINE_CLASS!r}."
        )
    for component in needed:
        spec = index.get(component)
        if not isinstance(spec, list) or len(spec) < 2:
            raise H3AppError(f"{name} lacks the {component!r} component in {INDEX_FILE}; this workflow needs it.")
        expected = EXPECTED_CLASSES.get(component)
        if expected is not None and spec[1] != expected:
            raise H3AppError(
                f"{name}: component {component!r} is a {spec[1]!r}, expected {expected!r}; is this an H3 repo?"
            )
        if not (folder / component).is_dir():
            raise H3AppError(f"{name} is missing the {component}/ folder; re-download it or check the path.")


def _patterns(needed: tuple[str, ...]) -> list[str]:
    return [INDEX_FILE, *(f"{component}/*" for component in needed)]


def _download(repo_id: str, revision: str | None, needed: tuple[str, ...], token: str | None) -> ModelLocation:
    from huggingface_hub import snapshot_download

    with _hub_errors(repo_id, revision):
        folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=_patterns(needed), token=token))
    commit = folder.name if len(folder.name) == 40 else None
    return ModelLocation(name=repo_id, folder=folder, repo_id=repo_id, revision=revision, commit=commit)


@contextmanager
def _hub_errors(repo_id: str, revision: str | None) -> Iterator[None]:
    """huggingface_hub's errors on a model repo as one line each."""
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except GatedRepoError as error:
        raise H3AppError(
            f"{repo_id} is gated: accept its licence on the Hub and set HF_TOKEN (or pass a token)."
        ) from error
    except RepositoryNotFoundError as error:
        raise H3AppError(
            f"model repo {repo_id} was not found on the Hub (or it is private): check the id, or set HF_TOKEN."
        ) from error
    except RevisionNotFoundError as error:
        raise H3AppError(f"revision {revision!r} of {repo_id} does not exist: check --revision.") from error
    except LocalEntryNotFoundError as error:
        raise H3AppError(
            f"{repo_id} is not in the local Hugging Face cache and the Hub cannot be reached (HF_HUB_OFFLINE is "
            f"set or the network is down): download it once online, or point --model at a local folder."
        ) from error


def is_hub_repo(model: str) -> bool:
    """``model`` names a Hub repo (not ``tiny``, not an existing local folder)."""
    return model != TINY and bool(_REPO_ID.match(model)) and not Path(model).expanduser().exists()


class DownloadProgress:
    """Bytes of ``repo_id``'s download for ``workflow``, read from the Hugging Face cache while ``locate`` runs.

    ``total``: the bytes of every file the workflow needs (huggingface_hub's own dry run: same patterns, same
    revision); ``missing``: those not yet cached when this was made. ``done()``: the files whose snapshot entry
    exists, plus the ``.incomplete`` files being written (huggingface_hub writes whole chunks, 10 MiB by default,
    so each file in flight shows up to one chunk late).
    """

    def __init__(self, repo_id: str, workflow: str = T2VA, revision: str | None = None,
                 token: str | None = None) -> None:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.file_download import repo_folder_name

        self.repo_id = repo_id
        with _hub_errors(repo_id, revision):
            files = snapshot_download(repo_id, revision=revision, token=token, dry_run=True,
                                      allow_patterns=_patterns(components_for(workflow)))
        self._files = [(Path(f.local_path), f.file_size or 0) for f in files]
        self.total = sum(size for _, size in self._files)
        self.missing = sum(f.file_size or 0 for f in files if f.will_download)
        self._blobs = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model") / "blobs"

    def done(self) -> int:
        """Bytes of the needed files on disk now (at most ``total``)."""
        finished = sum(size for path, size in self._files if path.exists())
        try:
            partial = sum(entry.stat().st_size for entry in self._blobs.glob("*.incomplete"))
        except OSError:  # a file renamed between listing and stat
            partial = 0
        return min(self.total, finished + partial)


def pending_download(model: str, workflow: str = T2VA, revision: str | None = None,
                     token: str | None = None) -> DownloadProgress | None:
    """The download ``model`` still needs before it can load, or None: offline, a local folder, everything cached,
    or the Hub refusing the dry run (the download itself then gives the one-line answer)."""
    from huggingface_hub import constants
    from huggingface_hub.errors import DryRunError, HfHubHTTPError

    if not is_hub_repo(model) or constants.HF_HUB_OFFLINE:
        return None
    try:
        download = DownloadProgress(model, workflow, revision, token)
    except (H3AppError, DryRunError, HfHubHTTPError, OSError):
        return None
    return download if download.missing else None


def locate(model: str, workflow: str = T2VA, revision: str | None = None, token: str | None = None,
           with_text_encoder: bool = True) -> ModelLocation:
    """Resolve ``model`` (``tiny`` | local folder | Hub repo id) to a checked local folder for ``workflow``."""
    needed = components_for(workflow, with_text_encoder)
    if model == TINY:
        location = ModelLocation(name=TINY, folder=TINY_DIR)
        if not TINY_DIR.is_dir():
            raise H3AppError(
                f"the embedded tiny checkpoint is missing at {TINY_DIR}: rebuild it with "
                f"`python -m h3app.model.tiny build assets/tiny-h3`."
            )
    elif Path(model).expanduser().is_dir():
        location = ModelLocation(name=model, folder=Path(model).expanduser().resolve())
    elif is_hub_repo(model):
        location = _download(model, revision, needed, token)
    else:
        raise H3AppError(
            f"--model {model!r} is neither `tiny`, an existing local folder, nor a Hub repo id like {REAL_REPO_ID}."
        )
    _check_index(location.folder, location.name, needed)
    return location


def read_transformer_config(model: str, partition: str = MAIN_PARTITION, revision: str | None = None,
                            token: str | None = None) -> dict[str, Any]:
    """The transformer's ``config.json`` (no weights read). For Hub repos only that file is fetched."""
    if partition not in PARTITIONS:
        raise H3AppError(f"partition must be {' or '.join(PARTITIONS)}, got {partition!r}.")
    if model == TINY:
        path = TINY_DIR / partition / "config.json"
    elif Path(model).expanduser().is_dir():
        path = Path(model).expanduser() / partition / "config.json"
    elif _REPO_ID.match(model):
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

        try:
            path = Path(hf_hub_download(model, "config.json", subfolder=partition, revision=revision, token=token))
        except LocalEntryNotFoundError as error:
            raise H3AppError(
                f"{model}/{partition}/config.json is not cached and the Hub cannot be reached: go online once or "
                f"use a local folder."
            ) from error
        except HfHubHTTPError as error:
            raise H3AppError(f"could not read {model}/{partition}/config.json from the Hub: {error}") from error
    else:
        raise H3AppError(f"--model {model!r} is neither `tiny`, a local folder, nor a Hub repo id.")
    if not path.is_file():
        raise H3AppError(f"{model} has no {partition}/config.json: is it a MiniMax H3 diffusers repo?")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise H3AppError(f"{path} is not valid JSON ({error}); re-download the model.") from error
