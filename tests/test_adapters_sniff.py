"""Which format a file is, decided by its own structure: safetensors first (an 8-byte length that fits the file, then
a JSON object), then the pickle family (raw pickles, torch.save zip archives), whatever the first bytes look like.

A safetensors header of 640, 896, 1152 or 1408 bytes begins with the bytes ``0x80 0x02``–``0x05``, which is also how
a pickle begins; such files are written here by ``safetensors.save_file`` itself, locally and through the Hub
stand-in, and must read as the safetensors files they are.
"""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import pytest
import torch
from hub_server import FakeHub
from safetensors.torch import save_file

from h3app.adapters.header import read_local_header, safetensors_layout
from h3app.adapters.inspect import inspect_file
from h3app.adapters.source import read_header
from h3app.errors import H3AppError

PICKLE_LOOKING_LENGTHS = {640: 2, 896: 3, 1152: 4, 1408: 5}  # header length → the byte after 0x80


def header_length(path: Path) -> int:
    return struct.unpack("<Q", path.read_bytes()[:8])[0]


def save_with_header_length(path: Path, target: int) -> dict[str, torch.Tensor]:
    """A small diffusers-named LoRA written by ``safetensors.save_file`` whose header is exactly ``target`` bytes
    (the metadata note is lengthened until safetensors' own 8-byte padding lands on it)."""
    tensors = {
        "transformer_blocks.0.attn.to_q.lora_A.weight": torch.randn(4, 16, generator=torch.Generator().manual_seed(1)),
        "transformer_blocks.0.attn.to_q.lora_B.weight": torch.randn(16, 4, generator=torch.Generator().manual_seed(2)),
        "transformer_blocks.0.attn.to_q.alpha": torch.tensor(2.0),
    }
    for extra in range(target):
        save_file(tensors, str(path), metadata={"note": "x" * extra})
        if header_length(path) == target:
            return tensors
        if header_length(path) > target:
            break
    raise AssertionError(f"could not write a {target}-byte header")


@pytest.mark.parametrize("length, protocol_byte", sorted(PICKLE_LOOKING_LENGTHS.items()))
def test_safetensors_whose_length_looks_like_a_pickle_opcode_is_read(tmp_path: Path, length: int,
                                                                     protocol_byte: int) -> None:
    path = tmp_path / "adapter.safetensors"
    tensors = save_with_header_length(path, length)
    assert path.read_bytes()[:2] == bytes([0x80, protocol_byte])  # what a pickle of that protocol starts with

    view = read_local_header(path)

    assert set(view.tensors) == set(tensors)
    assert view.tensors["transformer_blocks.0.attn.to_q.lora_A.weight"] == ("F32", (4, 16))
    assert view.scalars == {"transformer_blocks.0.attn.to_q.alpha": 2.0}
    info = inspect_file(path)
    assert (info.rank, info.alpha, info.alpha_source) == (4, 2.0, "module_tensor")


@pytest.mark.slow
def test_the_same_files_are_read_through_the_hub(fake_hub: FakeHub, tmp_path: Path) -> None:
    folder = tmp_path / "repo"
    folder.mkdir()
    for length in PICKLE_LOOKING_LENGTHS:
        save_with_header_length(folder / f"h{length}.safetensors", length)
    fake_hub.add_repo("me/opcodes", folder)
    for length in PICKLE_LOOKING_LENGTHS:
        local = folder / f"h{length}.safetensors"
        assert read_header("me/opcodes", weight_name=local.name) == read_local_header(local)


def _torch_save(path: Path) -> None:
    torch.save({"transformer_blocks.0.attn.to_q.lora_A.weight": torch.zeros(4, 16)}, path)


def _legacy_torch_save(path: Path) -> None:
    torch.save({"w": torch.zeros(4, 16)}, path, _use_new_zipfile_serialization=False)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_real_pickles_are_still_refused_as_pickles(tmp_path: Path, protocol: int) -> None:
    for payload in ({"a": 1}, {"state_dict": {"k" * 500: list(range(300))}}, [b"{" * 4000]):
        path = tmp_path / f"p{protocol}.safetensors"
        path.write_bytes(pickle.dumps(payload, protocol=protocol))
        with pytest.raises(H3AppError, match="is a Python pickle: pickles can run code"):
            read_local_header(path)


@pytest.mark.parametrize("writer, message", [(_torch_save, "is a zip archive"), (_legacy_torch_save, "is a Python pickle")])
def test_torch_save_files_renamed_to_safetensors_are_refused(tmp_path: Path, writer, message: str) -> None:
    path = tmp_path / "renamed.safetensors"
    writer(path)
    with pytest.raises(H3AppError, match=message):
        read_local_header(path)


def test_torch_pt_and_zip_pickles_are_refused_through_the_hub(fake_hub: FakeHub, tmp_path: Path) -> None:
    folder = tmp_path / "repo_pickles"
    folder.mkdir()
    _torch_save(folder / "zip.safetensors")
    (folder / "raw.safetensors").write_bytes(pickle.dumps({"a": list(range(100))}, protocol=2))
    fake_hub.add_repo("me/pickles", folder)
    with pytest.raises(H3AppError, match=r"me/pickles/zip\.safetensors is a zip archive"):
        read_header("me/pickles", weight_name="zip.safetensors")
    with pytest.raises(H3AppError, match=r"me/pickles/raw\.safetensors is a Python pickle"):
        read_header("me/pickles", weight_name="raw.safetensors")


def test_a_cut_short_safetensors_with_a_pickle_looking_length_is_named_truncated(tmp_path: Path) -> None:
    whole = tmp_path / "whole.safetensors"
    save_with_header_length(whole, 640)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(whole.read_bytes()[:300])
    with pytest.raises(H3AppError, match="is truncated"):
        read_local_header(cut)


def test_layout_rule() -> None:
    header = b'{"__metadata__":{}}'
    head = struct.pack("<Q", len(header)) + header
    assert safetensors_layout(head, len(head))
    assert not safetensors_layout(head, len(head) - 1)  # the length must fit the file
    assert not safetensors_layout(struct.pack("<Q", len(header)) + b" " + header[1:], len(head))  # '{' first
    assert not safetensors_layout(head[:8], 8)
