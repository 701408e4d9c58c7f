"""h3app.adapters.header: header-only reads, safetensors validation, and every way a download goes wrong."""

from __future__ import annotations

import io
import json
import pickle
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from adapter_fixtures import factors, forbid_tensor_loads, save, write_sparse_safetensors

from h3app.adapters.header import read_local_header
from h3app.errors import H3AppError


def _raw_file(path: Path, header: dict, data: bytes = b"") -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def _one_line_error(call) -> str:
    with pytest.raises(H3AppError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_reads_shapes_dtypes_metadata_and_scalars(tmp_path: Path) -> None:
    down, up = factors(32, 24, 4, seed=1, dtype=torch.bfloat16)
    path = save(
        tmp_path / "a.safetensors",
        {
            "blocks.0.attn.out_proj.lora_A.weight": down,
            "blocks.0.attn.out_proj.lora_B.weight": up,
            "blocks.0.attn.out_proj.alpha": torch.tensor(0.3),
            "blocks.1.attn.out_proj.alpha": torch.tensor(2.5, dtype=torch.bfloat16),
            "blocks.2.attn.out_proj.alpha": torch.tensor(6.0, dtype=torch.float16),
            "blocks.3.attn.out_proj.alpha": torch.tensor([4.25], dtype=torch.float64),
        },
        {"alpha": "8"},
    )
    view = read_local_header(path)
    assert view.tensors["blocks.0.attn.out_proj.lora_A.weight"] == ("BF16", (4, 24))
    assert view.tensors["blocks.0.attn.out_proj.lora_B.weight"] == ("BF16", (32, 4))
    assert view.metadata == {"alpha": "8"}
    # Exact stored values: F32 0.3 is 0.30000001192092896, never rounded or int()-truncated.
    assert view.scalars["blocks.0.attn.out_proj.alpha"] == float(torch.tensor(0.3).item())
    assert view.scalars["blocks.1.attn.out_proj.alpha"] == 2.5
    assert view.scalars["blocks.2.attn.out_proj.alpha"] == 6.0
    assert view.scalars["blocks.3.attn.out_proj.alpha"] == 4.25
    assert "blocks.0.attn.out_proj.lora_A.weight" not in view.scalars
    assert view.file_bytes == path.stat().st_size
    assert view.name == "a.safetensors"
    assert view.adapter_config is None


def test_reads_adapter_config_beside_the_file_or_given(tmp_path: Path) -> None:
    down, up = factors(8, 8, 2, seed=2)
    path = save(tmp_path / "adapter_model.safetensors", {"x.lora_A.weight": down, "x.lora_B.weight": up})
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 1.5}))
    assert read_local_header(path).adapter_config == {"r": 2, "lora_alpha": 1.5}
    other = tmp_path / "elsewhere.json"
    other.write_text(json.dumps({"lora_alpha": 3}))
    assert read_local_header(path, other).adapter_config == {"lora_alpha": 3}
    assert "does not exist" in _one_line_error(lambda: read_local_header(path, tmp_path / "missing.json"))


def test_malformed_adapter_config_is_refused(tmp_path: Path) -> None:
    down, up = factors(8, 8, 2, seed=2)
    path = save(tmp_path / "adapter_model.safetensors", {"x.lora_A.weight": down, "x.lora_B.weight": up})
    (tmp_path / "adapter_config.json").write_text("{not json")
    assert "adapter_config.json is not valid JSON" in _one_line_error(lambda: read_local_header(path))
    (tmp_path / "adapter_config.json").write_text("[1, 2]")
    assert "must hold a JSON object" in _one_line_error(lambda: read_local_header(path))


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.safetensors"
    path.write_bytes(b"")
    assert "is empty (0 bytes)" in _one_line_error(lambda: read_local_header(path))


def test_truncated_download_names_both_sizes(tmp_path: Path) -> None:
    down, up = factors(64, 64, 8, seed=3)
    full = save(tmp_path / "full.safetensors", {"x.lora_A.weight": down, "x.lora_B.weight": up}).read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(full[: len(full) - 100])
    message = _one_line_error(lambda: read_local_header(cut))
    assert f"the file is {len(full) - 100:,} bytes but its header says ≥ {len(full):,}" in message
    assert "re-download" in message
    cut.write_bytes(full[:20])  # inside the header itself
    assert "truncated" in _one_line_error(lambda: read_local_header(cut))


def test_html_page_and_lfs_pointer(tmp_path: Path) -> None:
    html = tmp_path / "page.safetensors"
    html.write_bytes(b"<!DOCTYPE html>\n<html><body>Sign in</body></html>")
    assert "is an HTML page" in _one_line_error(lambda: read_local_header(html))
    lfs = tmp_path / "pointer.safetensors"
    lfs.write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 1383677888\n")
    assert "git-lfs pointer" in _one_line_error(lambda: read_local_header(lfs))


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".ckpt", ".pth"])
def test_pickle_suffixes_are_refused_without_reading(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"adapter{suffix}"
    path.write_bytes(b"anything")
    message = _one_line_error(lambda: read_local_header(path))
    assert "pickle" in message and "can run code" in message and ".safetensors" in message


def test_pickle_content_under_a_safetensors_name_is_refused(tmp_path: Path) -> None:
    raw_pickle = tmp_path / "renamed.safetensors"
    raw_pickle.write_bytes(pickle.dumps({"a": 1}, protocol=4))
    assert "Python pickle" in _one_line_error(lambda: read_local_header(raw_pickle))
    zipped = tmp_path / "torch_save.safetensors"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", b"x")
    zipped.write_bytes(buffer.getvalue())
    assert "zip archive" in _one_line_error(lambda: read_local_header(zipped))


def test_header_over_100_mb_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "huge.safetensors"
    path.write_bytes(struct.pack("<Q", 200_000_000) + b"{}")
    assert "200,000,000-byte header" in _one_line_error(lambda: read_local_header(path))


def test_header_must_be_a_json_object(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 5) + b"[1,2]")
    assert "not a JSON object" in _one_line_error(lambda: read_local_header(path))
    path.write_bytes(struct.pack("<Q", 5) + b"{oops")
    assert "not valid JSON" in _one_line_error(lambda: read_local_header(path))


def test_offsets_must_tile_the_buffer(tmp_path: Path) -> None:
    header = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]},  # a 4-byte hole
    }
    path = _raw_file(tmp_path / "hole.safetensors", header, b"\x00" * 20)
    assert "holes or overlaps" in _one_line_error(lambda: read_local_header(path))
    wrong_size = {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}
    path = _raw_file(tmp_path / "size.safetensors", wrong_size, b"\x00" * 8)
    assert "occupies 8 bytes, not 12" in _one_line_error(lambda: read_local_header(path))


def test_unknown_dtype_duplicate_keys_and_trailing_bytes(tmp_path: Path) -> None:
    path = _raw_file(tmp_path / "dtype.safetensors", {"a": {"dtype": "F12", "shape": [1], "data_offsets": [0, 2]}}, b"\x00\x00")
    assert "unknown dtype 'F12'" in _one_line_error(lambda: read_local_header(path))
    raw = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    dup = tmp_path / "dup.safetensors"
    dup.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\x00")
    assert "names 'a' twice" in _one_line_error(lambda: read_local_header(dup))
    extra = _raw_file(tmp_path / "extra.safetensors", {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\x00" * 9)
    assert "8 bytes after the end" in _one_line_error(lambda: read_local_header(extra))
    bad_meta = _raw_file(tmp_path / "meta.safetensors", {"__metadata__": {"alpha": 8}})
    assert "__metadata__ must map strings to strings" in _one_line_error(lambda: read_local_header(bad_meta))


def test_missing_path_and_folder(tmp_path: Path) -> None:
    assert "does not exist" in _one_line_error(lambda: read_local_header(tmp_path / "nope.safetensors"))
    assert "is a folder" in _one_line_error(lambda: read_local_header(tmp_path))


def test_never_reads_tensor_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the 8-byte length, the header and the scalars' bytes are read, and safetensors never loads a tensor."""
    entries = {"blocks.0.attn.qkv_proj.lora_A.weight": ("BF16", (64, 5376)),
               "blocks.0.attn.qkv_proj.lora_B.weight": ("BF16", (21504, 64))}
    path = write_sparse_safetensors(tmp_path / "big.safetensors", entries, scalars={"blocks.0.attn.qkv_proj.alpha": 8.0})
    header_bytes = 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]

    read_total = {"bytes": 0}
    real_open = Path.open

    def counting_open(self: Path, *args, **kwargs):
        handle = real_open(self, *args, **kwargs)
        real_read = handle.read

        def read(size: int = -1) -> bytes:
            chunk = real_read(size)
            read_total["bytes"] += len(chunk)
            return chunk

        handle.read = read  # type: ignore[method-assign]
        return handle

    monkeypatch.setattr(Path, "open", counting_open)
    forbid_tensor_loads(monkeypatch)
    view = read_local_header(path)
    assert view.scalars == {"blocks.0.attn.qkv_proj.alpha": 8.0}
    assert view.tensors["blocks.0.attn.qkv_proj.lora_B.weight"] == ("BF16", (21504, 64))
    assert read_total["bytes"] <= header_bytes + 64 + 4
    assert path.stat().st_size > 2_000_000
