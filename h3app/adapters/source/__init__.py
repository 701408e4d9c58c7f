"""Where an adapter file comes from (docs/sources.md): a Hub repo id, an HF URL, a local file or folder, an upload
→ a local ``.safetensors`` file pinned to the commit it came from, or, before any download, its header.

One concern per module: ``names`` (repo ids, revisions, weight names: text checks), ``weights`` (a repo's or
folder's files, choosing one), ``local`` (folder listing, the hosted allow-list), ``refs`` (what ``SOURCE`` names:
``parse_source``, HF URLs), ``hub`` (listing, pinned downloads, access, every Hub failure → one line),
``remote_header`` (a Hub file's header by Range reads), ``limits`` (the hosted size cap), ``files`` (the entry
points: ``list_weight_files``, ``read_header``, ``fetch``, ``current_identity``) and ``search`` (the Hub's
MiniMax-H3 adapters, ``search_adapters``).
"""

from __future__ import annotations

from .files import (
                    AdapterFile,
                    SourceIdentity,
                    current_identity,
                    fetch,
                    file_sha256,
                    list_weight_files,
                    read_header,
                    retry_if_trimmed,
)
from .hub import check_access
from .limits import adapter_size_cap
from .local import implied_weight
from .names import WEIGHT_SUFFIX, check_revision, check_weight_name
from .refs import SourceRef, parse_source
from .weights import MultipleWeightFiles, WeightFile, choose_weight, describe_files

__all__ = [
    "AdapterFile", "MultipleWeightFiles", "SourceIdentity", "SourceRef", "WeightFile", "WEIGHT_SUFFIX",
    "adapter_size_cap", "check_access", "check_revision", "check_weight_name", "choose_weight", "current_identity",
    "describe_files", "fetch", "file_sha256", "implied_weight", "list_weight_files", "parse_source", "read_header",
    "retry_if_trimmed",
]
