"""Read a local safetensors adapter's header and its 0-dim scalars, never its weight tensors.

The header is validated the way the safetensors format specifies it (8-byte little-endian length, a JSON object,
offsets that tile the byte buffer exactly, known dtypes, a file exactly as long as the header says) *before*
anything else touches the file, so every way a download goes wrong becomes one ``H3AppError`` that names what was
seen: an empty file, a truncated download, an HTML page, a git-lfs pointer, a pickle. Pickle files are refused
outright: unpickling runs code.
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import H3AppError
from . import memo
from .header_caps import check_header_length, check_tensor_count
from .memo import file_version
from .recipe import SIDECAR_NAMES, read_sidecars
from .types import HeaderView

ADAPTER_CONFIG_NAME = "adapter_config.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")

# Bits per element of every dtype the safetensors format defines (tensor.rs `enum Dtype`).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
# The dtypes whose 0-dim values we decode (alpha scalars); struct formats, little-endian.
_SCALAR_FORMATS = {"F64": "<d", "F32": "<f", "F16": "<e", "I64": "<q", "I32": "<i", "I16": "<h", "I8": "<b",
                   "U8": "<B", "U16": "<H", "U32": "<I", "U64": "<Q"}


def read_local_header(path: str | Path, adapter_config_path: str | Path | None = None) -> HeaderView:
    """The header of a local ``.safetensors`` file plus its 0-dim (and single-element ``.alpha``) scalars.

    ``adapter_config_path`` defaults to ``adapter_config.json`` in the same folder, read when present. Reads
    8 + N header bytes and a few bytes per scalar: weight tensors are never loaded; an unchanged file (and
    adapter_config.json) is read once per process (``memo.py``). A file that disappears while
    it is read (another request trimming the download cache) is one ``H3AppError``, never a raw OS error.
    """
    path = Path(path)
    config_path = Path(adapter_config_path) if adapter_config_path is not None else path.with_name(ADAPTER_CONFIG_NAME)
    version = file_version(path)
    try:
        if version is None:  # missing (or unreadable): the reader names the problem
            return _read_local_header(path, adapter_config_path)
        key = (version, file_version(config_path), adapter_config_path is not None,
               *(file_version(path.with_name(name)) for name in SIDECAR_NAMES))
        return memo.HEADERS.get_or_compute(key, lambda: _read_local_header(path, adapter_config_path))
    except FileNotFoundError as error:
        raise vanished(error.filename or path) from None


class VanishedFile(H3AppError):
    """A file that was there a moment ago and is gone now (safe to retry once)."""


def vanished(path: str | Path) -> VanishedFile:
    """The one-line error for a file that was there a moment ago and is gone now."""
    return VanishedFile(
        f"{path} disappeared while it was being read (the download cache was trimmed, or the file was moved): "
        "retry; the adapter is downloaded again if needed."
    )


def _read_local_header(path: Path, adapter_config_path: str | Path | None) -> HeaderView:
    if not path.exists():
        raise H3AppError(f"{path} does not exist: check the path.")
    if path.is_dir():
        raise H3AppError(f"{path} is a folder, not a file: give the .safetensors file inside it.")
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise H3AppError(
            f"{path.name} is a pickle file ({path.suffix}): pickles can run code when loaded, so they are refused; "
            "ask for (or convert it to) a .safetensors file."
        )
    file_bytes = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(64)
        refuse_non_safetensors(path.name, head, file_bytes)
        (header_len,) = struct.unpack("<Q", head[:8])
        check_header_length(header_len, path.name)
        if 8 + header_len > file_bytes:
            raise H3AppError(
                f"{path.name} is truncated: the file is {file_bytes:,} bytes but its header says ≥ {8 + header_len:,}: "
                "re-download it."
            )
        handle.seek(8)
        raw_header = handle.read(header_len)
        tensors, metadata, buffer_end = parse_header(raw_header, path.name)
        expected = 8 + header_len + buffer_end
        if file_bytes < expected:
            raise H3AppError(
                f"{path.name} is truncated: the file is {file_bytes:,} bytes but its header says ≥ {expected:,}: "
                "re-download it."
            )
        if file_bytes > expected:
            raise H3AppError(
                f"{path.name} has {file_bytes - expected:,} bytes after the end its header declares "
                f"({expected:,}): not a valid safetensors file; re-download it."
            )
        scalars = read_scalars(handle, 8 + header_len, tensors)
    _confirm_with_safetensors(path, tensors)

    config_path = Path(adapter_config_path) if adapter_config_path is not None else path.with_name(ADAPTER_CONFIG_NAME)
    if adapter_config_path is not None and not config_path.is_file():
        raise H3AppError(f"{config_path} does not exist: check the adapter_config.json path.")
    adapter_config = read_adapter_config(config_path) if config_path.is_file() else None
    return make_header_view(tensors, metadata, scalars, adapter_config, file_bytes, path.name,
                            read_sidecars(path.parent))


def make_header_view(tensors: Mapping[str, tuple[str, tuple[int, ...], tuple[int, int]]], metadata: Mapping[str, str],
                     scalars: Mapping[str, float], adapter_config: Mapping[str, Any] | None, file_bytes: int,
                     name: str, sidecars: Mapping[str, Any] | None = None) -> HeaderView:
    """A ``HeaderView`` from :func:`parse_header`'s entries (offsets dropped), for local and remote files alike;
    ``sidecars``: the recipe files beside a local file (``recipe.read_sidecars``)."""
    return HeaderView(
        tensors={key: (dtype, shape) for key, (dtype, shape, _) in tensors.items()},
        metadata=metadata,
        scalars=scalars,
        adapter_config=adapter_config,
        file_bytes=file_bytes,
        name=name,
        sidecars=dict(sidecars or {}),
    )


def safetensors_layout(head: bytes, file_bytes: int) -> bool:
    """Whether ``head`` (the first ≥ 9 bytes) starts the way the safetensors format does: an 8-byte little-endian
    header length N that fits the file (``8 + N ≤ file_bytes``), then a JSON object whose first byte is ``{``.

    Decided first, before any other format's magic bytes: a header length of 640, 896, 1152 or 1408 bytes begins
    with the bytes ``0x80 0x02``–``0x05``, a pickle's protocol opcode, and is still a safetensors file.
    """
    if len(head) < 9:
        return False
    (header_len,) = struct.unpack("<Q", head[:8])
    return header_len >= 2 and 8 + header_len <= file_bytes and head[8:9] == b"{"


def refuse_non_safetensors(name: str, head: bytes, file_bytes: int) -> None:
    """Refuse what is not a safetensors file, naming the usual impostors (pickle, zip, git-lfs pointer, HTML page).

    Shared by local and remote reads. ``head`` is the file's first bytes (64 or more are enough). A file with the
    safetensors layout (:func:`safetensors_layout`) passes; the header itself is validated afterwards.
    """
    if file_bytes == 0:
        raise H3AppError(f"{name} is empty (0 bytes): re-download it.")
    if safetensors_layout(head, file_bytes):
        return
    stripped = head.lstrip()
    if head.startswith(b"version https://git-lfs"):
        raise H3AppError(
            f"{name} is a git-lfs pointer ({file_bytes} bytes), not the weights: fetch the real file "
            "(git lfs pull, or download it from the Hub)."
        )
    if stripped[:1] == b"<" and stripped[:15].lower().startswith((b"<!doctype", b"<html", b"<?xml", b"<head", b"<body")):
        raise H3AppError(
            f"{name} is an HTML page, not a safetensors file (a login or error page saved under that name): "
            "check the URL or token and download it again."
        )
    if head.startswith(b"PK\x03\x04"):
        raise H3AppError(
            f"{name} is a zip archive (PyTorch's pickle format): pickles can run code when loaded, so they are "
            "refused; ask for (or convert it to) a .safetensors file."
        )
    # A "{" after 8 bytes is a safetensors header whose file is cut short: named as truncated by the caller.
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05") and head[8:9] != b"{":
        raise H3AppError(
            f"{name} is a Python pickle: pickles can run code when loaded, so they are refused; ask for (or convert "
            "it to) a .safetensors file."
        )
    if file_bytes < 8:
        raise H3AppError(f"{name} is only {file_bytes} bytes, too short for a safetensors header: re-download it.")


def parse_header(
    raw_header: bytes, name: str
) -> tuple[dict[str, tuple[str, tuple[int, ...], tuple[int, int]]], dict[str, str], int]:
    """Validate a safetensors JSON header; return key → (dtype, shape, (begin, end)), metadata, buffer length.

    Shared with remote reads (the header bytes are the same wherever they come from). The tensor count is capped
    on the raw bytes first (``header_caps.MAX_TENSORS``), so a header bomb is refused before any JSON is parsed.
    """
    check_tensor_count(raw_header, name)
    try:
        text = raw_header.decode("utf-8")
    except UnicodeDecodeError:
        raise H3AppError(f"{name} is not a safetensors file: its header is not UTF-8 text; re-download it.") from None
    if not text.lstrip().startswith("{"):
        raise H3AppError(f"{name} is not a safetensors file: its header is not a JSON object; re-download it.")

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found = dict(pairs)
        if len(found) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise H3AppError(f"{name} is not a valid safetensors file: its header names {key!r} twice.")
                seen.add(key)
        return found

    try:
        header = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as error:
        raise H3AppError(f"{name} is not a safetensors file: its header is not valid JSON ({error.msg}); re-download it.") from None
    except RecursionError:
        raise H3AppError(f"{name} is not a valid safetensors file: its header JSON is nested too deeply (a "
                         "safetensors header is one flat object of tensors); re-download it.") from None
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise H3AppError(f"{name} is not a valid safetensors file: its header holds a number with too many digits; "
                         "re-download it.") from None
    if not isinstance(header, dict):
        raise H3AppError(f"{name} is not a safetensors file: its header is not a JSON object; re-download it.")

    raw_metadata = header.pop("__metadata__", None) or {}
    if not isinstance(raw_metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw_metadata.items()):
        raise H3AppError(f"{name} is not a valid safetensors file: __metadata__ must map strings to strings.")

    checked = _check_entries_together(header) or _check_entries_one_by_one(header, name)
    return checked[0], dict(raw_metadata), checked[1]


Entries = dict[str, tuple[str, tuple[int, ...], tuple[int, int]]]
_ENTRY_VALUES = operator.itemgetter("dtype", "shape", "data_offsets")


def _check_entries_together(header: Mapping[str, Any]) -> tuple[Entries, int] | None:
    """The checks of :func:`_check_entries_one_by_one` a column at a time (loops in C; a 624-tensor header in a
    fraction of the time): the entries and the buffer length when every entry is valid, else None (the one-by-one
    check then names the first problem)."""
    values = list(header.values())
    if not values:
        return {}, 0
    if set(map(type, values)) != {dict}:
        return None
    try:
        dtypes, shapes, offsets = zip(*map(_ENTRY_VALUES, values))
    except KeyError:  # an entry lacks a field
        return None
    if set(map(type, dtypes)) != {str} or not set(dtypes) <= DTYPE_BITS.keys():
        return None
    if set(map(type, shapes)) != {list} or set(map(type, offsets)) != {list} or set(map(len, offsets)) != {2}:
        return None
    dims, bounds = list(itertools.chain.from_iterable(shapes)), list(itertools.chain.from_iterable(offsets))
    if not set(map(type, dims)) <= {int} or set(map(type, bounds)) != {int} or min(bounds) < 0 or min(dims, default=0) < 0:
        return None  # (JSON booleans are of type bool, not int, so they fail here as they do one by one)
    begins, ends = bounds[0::2], bounds[1::2]
    if not all(map(operator.le, begins, ends)):
        return None
    bytes_x8 = list(map(operator.mul, map(operator.sub, ends, begins), itertools.repeat(8)))
    if bytes_x8 != list(map(operator.mul, map(math.prod, shapes), map(DTYPE_BITS.__getitem__, dtypes))):
        return None  # (end - begin) * 8 == elements × bits also says that the bits fill whole bytes
    sorted_begins, sorted_ends = zip(*sorted(zip(begins, ends)))
    if sorted_begins[0] != 0 or sorted_begins[1:] != sorted_ends[:-1]:
        return None
    entries = dict(zip(header, zip(dtypes, map(tuple, shapes), zip(begins, ends))))
    return entries, sorted_ends[-1]


def _check_entries_one_by_one(header: Mapping[str, Any], name: str) -> tuple[Entries, int]:
    """Every entry's fields, then the entries in offset order tiling the buffer; ``H3AppError`` for the first
    problem."""
    tensors: Entries = {}
    for key, entry in header.items():
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
            raise H3AppError(f"{name} is not a valid safetensors file: header entry {key!r} lacks dtype/shape/data_offsets.")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
            raise H3AppError(f"{name}: tensor {key!r} has unknown dtype {dtype!r}; the file is damaged or from a newer format.")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise H3AppError(f"{name} is not a valid safetensors file: tensor {key!r} has shape {shape!r}.")
        if (
            not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
            or offsets[0] > offsets[1]
        ):
            raise H3AppError(f"{name} is not a valid safetensors file: tensor {key!r} has data_offsets {offsets!r}.")
        tensors[key] = (dtype, tuple(shape), (offsets[0], offsets[1]))

    cursor = 0
    for key, (dtype, shape, (begin, end)) in sorted(tensors.items(), key=lambda item: item[1][2]):
        if begin != cursor:
            raise H3AppError(
                f"{name} is not a valid safetensors file: tensor {key!r} starts at byte {begin} of the data where "
                f"{cursor} was expected (holes or overlaps); re-download it."
            )
        bits = math.prod(shape) * DTYPE_BITS[dtype]
        if bits % 8 or end - begin != bits // 8:
            raise H3AppError(
                f"{name} is not a valid safetensors file: tensor {key!r} ({dtype} {list(shape)}) occupies "
                f"{end - begin} bytes, not {bits / 8:g}."
            )
        cursor = end
    return tensors, cursor


def is_scalar_entry(key: str, shape: tuple[int, ...]) -> bool:
    """0-dim tensors, and single-element ``*.alpha`` tensors (some writers store alpha as shape [1])."""
    return shape == () or (key.endswith(".alpha") and math.prod(shape) == 1)


def decode_scalar(dtype: str, raw: bytes) -> float | None:
    """The value of one little-endian scalar of safetensors dtype ``dtype`` (None for fp8/sub-byte dtypes)."""
    if dtype == "BF16":
        return float(struct.unpack("<f", b"\x00\x00" + raw)[0])
    if dtype == "BOOL":
        return float(raw != b"\x00")
    if dtype in _SCALAR_FORMATS:
        return float(struct.unpack(_SCALAR_FORMATS[dtype], raw)[0])
    return None  # no adapter stores alpha as fp8 or sub-byte floats


def read_scalars(handle: Any, data_start: int, tensors: Mapping[str, tuple[str, tuple[int, ...], tuple[int, int]]]) -> dict[str, float]:
    """Decode every scalar entry (see ``is_scalar_entry``), a few bytes each."""
    scalars: dict[str, float] = {}
    for key, (dtype, shape, (begin, end)) in tensors.items():
        if not is_scalar_entry(key, shape):
            continue
        handle.seek(data_start + begin)
        value = decode_scalar(dtype, handle.read(end - begin))
        if value is not None:
            scalars[key] = value
    return scalars


def _confirm_with_safetensors(path: Path, tensors: Mapping[str, tuple[str, tuple[int, ...], tuple[int, int]]]) -> None:
    """The safetensors library must agree with our reading (it maps the file; no tensor data is read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:  # header only; "pt" would import torch
            keys = handle.keys()  # distinct names: equal sets when the counts match and each is ours
            if len(keys) != len(tensors) or not all(map(tensors.__contains__, keys)):
                raise H3AppError(f"{path.name}: the safetensors library lists different tensors than its header; re-download it.")
            for key in itertools.islice(tensors, 1):
                view = handle.get_slice(key)
                if (view.get_dtype(), tuple(view.get_shape())) != tensors[key][:2]:
                    raise H3AppError(f"{path.name}: the safetensors library reads tensor {key!r} differently; re-download it.")
    except SafetensorError as error:
        raise H3AppError(f"{path.name} is not a valid safetensors file ({error}); re-download it.") from None


def read_adapter_config(path: str | Path) -> dict[str, Any]:
    """``adapter_config.json`` (PEFT) as a dict; malformed JSON or a non-object is an ``H3AppError``."""
    path = Path(path)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise vanished(path) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise H3AppError(f"{path} is not valid JSON ({error}): fix or delete it.") from None
    if not isinstance(config, dict):
        raise H3AppError(f"{path} must hold a JSON object (PEFT's LoraConfig), got {type(config).__name__}: fix or delete it.")
    return config
