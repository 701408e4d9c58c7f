"""The header and 0-dim scalars of a Hub file, read with HTTP Range requests through ``huggingface_hub.HfFileSystem``
(pinned to the listed commit), so format, rank and alpha show before a multi-GB download.

Reads: the first ``FIRST_READ_BYTES`` (the 8-byte length and, for nearly every adapter, the whole header); the rest
of the header only when it is longer, after its length passed ``header_caps.check_header_length``; then the scalar
tensors (``.alpha``), neighbours closer than ``SCALAR_SPAN_GAP`` merged into one request and the rest fetched in
parallel. The raw header bytes go through the same ``parse_header`` as a local file's (one parse, no re-encoding),
and the file size the Hub lists must equal what the header declares.
"""

from __future__ import annotations

import hashlib
import math
import posixpath
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...errors import H3AppError
from ...rules.units import format_bytes
from .. import memo
from ..header import (
    ADAPTER_CONFIG_NAME,
    make_header_view,
    parse_header,
    read_adapter_config,
    read_scalars,
    refuse_non_safetensors,
)
from ..header_caps import check_header_length
from ..types import HeaderView
from .hub import SIDECAR_MAX_BYTES, HubListing, Token, hub_cache, hub_errors, remote_size
from .local import LocalPath
from .names import COMMIT_SHA
from .refs import SourceRef
from .weights import WeightFile

FIRST_READ_BYTES = 100_001  # bytes 0-100000: what huggingface_hub's own safetensors metadata parser reads first
SCALAR_SPAN_GAP = 64 * 1024  # scalars closer than this (bytes) are read in one Range request
RANGE_READ_WORKERS = 8  # concurrent Range requests when scalars are spread over the file

Entries = Mapping[str, tuple[str, tuple[int, ...], tuple[int, int]]]


def read_remote_header(ref: SourceRef, weight: WeightFile, listing: HubListing, token: Token,
                       cache_dir: LocalPath | None) -> HeaderView:
    """``weight``'s header view at ``listing.commit``; ``adapter_config.json`` from the same folder of the repo
    (downloaded: it is small) when the listing has one. Remembered per (endpoint, repo, commit, file, token)."""
    from huggingface_hub import constants

    pinned = listing.commit or ref.revision
    if pinned is None or not COMMIT_SHA.match(pinned):
        return _read(ref, weight, listing, token, cache_dir)
    token_key = hashlib.sha256(token.encode()).hexdigest() if isinstance(token, str) else token
    key = (constants.ENDPOINT, ref.repo_id, pinned, weight.name, token_key)
    return memo.HEADERS.get_or_compute(key, lambda: _read(ref, weight, listing, token, cache_dir))


def _read(ref: SourceRef, weight: WeightFile, listing: HubListing, token: Token,
          cache_dir: LocalPath | None) -> HeaderView:
    from huggingface_hub import HfFileSystem, hf_hub_download

    pinned = listing.commit or ref.revision
    name = posixpath.basename(weight.name)
    where = f"{ref.repo_id}/{weight.name}"
    with hub_errors(ref, weight.name):
        size = weight.size if weight.size is not None else remote_size(ref, weight.name, token)
        if size is None:
            raise H3AppError(f"the Hub lists no size for {where}: download the file and inspect it locally.")
        fs = HfFileSystem(token=token, skip_instance_cache=True)
        path = f"{ref.repo_id}/{weight.name}"

        def read(start: int, stop: int) -> bytes:
            """Bytes ``start``..``stop - 1`` (one Range request)."""
            data = fs.cat_file(path, start=start, end=stop, revision=pinned, size=size, cache_type="none")
            if len(data) != stop - start:
                raise H3AppError(
                    f"{where}: a {stop - start}-byte range read returned {len(data)} bytes: the file is shorter than "
                    "its header says; fix the upload or pick another file."
                )
            return data

        tensors, metadata, data_start = _read_header(read, size, where)
        scalars = _read_scalars(read, tensors, data_start)

    adapter_config = None
    config_name = posixpath.join(posixpath.dirname(weight.name), ADAPTER_CONFIG_NAME).lstrip("/")
    if config_name in listing.files:
        config_size = listing.files[config_name]
        if config_size is not None and config_size > SIDECAR_MAX_BYTES:
            raise H3AppError(
                f"{ref.repo_id}/{config_name} is {format_bytes(config_size)}, far too large for an adapter config "
                f"(limit {format_bytes(SIDECAR_MAX_BYTES)}): fix the repo, or download the file and inspect it locally."
            )
        with hub_errors(ref, config_name):
            config_path = hf_hub_download(ref.repo(), config_name, revision=pinned, token=token,
                                          cache_dir=hub_cache(cache_dir))
        adapter_config = read_adapter_config(config_path)
    return make_header_view(tensors, metadata, scalars, adapter_config, size, name)


def _read_header(read: Any, size: int, where: str) -> tuple[dict, dict[str, str], int]:
    """(entries, metadata, data start) of a remote file of ``size`` bytes; the size must match the header's."""
    if size < 8:
        raise H3AppError(f"{where} is not a valid safetensors file: it is only {size} bytes.")
    first = read(0, min(size, FIRST_READ_BYTES))
    refuse_non_safetensors(where, first, size)
    header_len = int.from_bytes(first[:8], "little")
    check_header_length(header_len, where)
    if 8 + header_len > size:
        raise H3AppError(
            f"{where} is not a valid safetensors file: its first 8 bytes claim a {header_len:,}-byte header in a "
            f"{size:,}-byte file; fix the upload or pick another file."
        )
    raw = first[8:8 + header_len]
    if len(raw) < header_len:
        raw += read(len(first), 8 + header_len)
    tensors, metadata, buffer_end = parse_header(raw, where)
    declared = 8 + header_len + buffer_end
    if declared != size:
        problem = "is truncated" if size < declared else f"has {size - declared:,} bytes after the end its header declares"
        raise H3AppError(
            f"{where} {problem} (the Hub says {size:,} bytes, its header {declared:,}): not a valid safetensors "
            "file; fix the upload or pick another file."
        )
    return tensors, metadata, 8 + header_len


def _read_scalars(read: Any, tensors: Entries, data_start: int) -> dict[str, float]:
    """Decode the single-element tensors: their byte spans, neighbours merged, read in parallel."""
    spans = sorted((data_start + begin, data_start + end) for (_, shape, (begin, end)) in tensors.values()
                   if math.prod(shape) == 1 and end > begin)
    if not spans:
        return {}
    merged: list[list[int]] = []
    for begin, end in spans:
        if merged and begin - merged[-1][1] <= SCALAR_SPAN_GAP:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([begin, end])
    if len(merged) == 1:
        chunks = [read(*merged[0])]
    else:
        with ThreadPoolExecutor(max_workers=min(RANGE_READ_WORKERS, len(merged))) as pool:
            chunks = list(pool.map(lambda span: read(*span), merged))
    return read_scalars(_Spans({begin: data for (begin, _), data in zip(merged, chunks)}), data_start, tensors)


class _Spans:
    """A read-only file-like view of the byte spans fetched from a remote file (what ``read_scalars`` reads)."""

    def __init__(self, chunks: dict[int, bytes]) -> None:
        self._chunks = chunks
        self._position = 0

    def seek(self, position: int) -> int:
        self._position = position
        return position

    def read(self, count: int) -> bytes:
        start, stop = self._position, self._position + count
        for chunk_start, data in self._chunks.items():
            if chunk_start <= start and stop <= chunk_start + len(data):
                self._position = stop
                return data[start - chunk_start:stop - chunk_start]
        raise ValueError(f"bytes {start}-{stop} were not fetched")  # every scalar span is fetched above
