"""A public server under abuse, the adapter side: header bombs refused before any JSON is parsed (local and remote,
with bounded reads and memory), and no file-existence oracle in hosted mode."""

from __future__ import annotations

import json
import struct
import tracemalloc
from pathlib import Path

import pytest
from hub_server import FakeHub

from h3app.adapters import header as header_module
from h3app.adapters.header import parse_header, read_local_header
from h3app.adapters.header_caps import MAX_HEADER_BYTES, MAX_TENSORS, TENSOR_MARGIN
from h3app.adapters.source import implied_weight, parse_source, read_header
from h3app.errors import H3AppError
from h3app.rules.h3_modules import FULL_SIZE_CONFIG, transformer_shapes
from h3app.rules.values import short


def scalar_bomb(path: Path, count: int) -> Path:
    """A valid safetensors file of ``count`` F32 0-dim ``.alpha`` tensors (the attack: many tiny entries)."""
    entries = {f"m{i}.alpha": {"dtype": "F32", "shape": [], "data_offsets": [4 * i, 4 * i + 4]} for i in range(count)}
    raw = json.dumps(entries, separators=(",", ":")).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(4 * count))
    return path


def length_bomb(path: Path, claimed: int, size: int) -> Path:
    """A sparse file whose 8-byte prefix claims a ``claimed``-byte header (the rest is zeros, never written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", claimed) + b'{"')
        handle.truncate(size)
    return path


def refuse_json_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if any safetensors header JSON is parsed (other JSON, such as the Hub's answers, is fine)."""
    real = json.loads

    def no_header_parse(text, *args, **kwargs):
        if "data_offsets" in (text.decode(errors="replace") if isinstance(text, bytes) else str(text)):
            raise AssertionError("the header JSON was parsed")
        return real(text, *args, **kwargs)

    monkeypatch.setattr(header_module.json, "loads", no_header_parse)


def test_the_caps_leave_room_for_the_largest_h3_adapter() -> None:
    targets = list(transformer_shapes(FULL_SIZE_CONFIG).linears)
    entries, offset = {}, 0
    for partition in ("transformer", "transformer_ref"):
        for target in targets:
            for suffix, shape in (("lora_A.default.weight", [128, 5376]), ("lora_B.default.weight", [43008, 128]),
                                  ("alpha", [])):
                size = 2 * (shape[0] * shape[1] if shape else 1)
                entries[f"base_model.model.{partition}.{target}.{suffix}"] = {
                    "dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
                offset += size
    raw = json.dumps(entries).encode()
    assert len(entries) * TENSOR_MARGIN <= MAX_TENSORS and len(raw) * TENSOR_MARGIN <= MAX_HEADER_BYTES
    assert len(parse_header(raw, "largest.safetensors")[0]) == len(entries) == 2 * len(targets) * 3


def test_a_header_with_too_many_tensors_is_refused_before_parsing_with_bounded_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = scalar_bomb(tmp_path / "bomb.safetensors", MAX_TENSORS + 1)
    assert bomb.stat().st_size < MAX_HEADER_BYTES  # under the byte cap: only the count refuses it
    refuse_json_parsing(monkeypatch)
    tracemalloc.start()
    try:
        with pytest.raises(H3AppError, match=rf"lists about {MAX_TENSORS + 1:,} tensors.*limit {MAX_TENSORS:,}"):
            read_local_header(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * bomb.stat().st_size  # the raw header and little else: no per-tensor objects


def test_a_header_length_over_the_cap_is_refused_from_its_8_byte_prefix(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = length_bomb(tmp_path / "long.safetensors", MAX_HEADER_BYTES + 1, MAX_HEADER_BYTES + 1024)
    refuse_json_parsing(monkeypatch)
    with pytest.raises(H3AppError, match=rf"claim a {MAX_HEADER_BYTES + 1:,}-byte header.*limit {MAX_HEADER_BYTES:,}"):
        read_local_header(bomb)


@pytest.mark.slow
def test_a_remote_header_bomb_is_refused_after_one_bounded_read(fake_hub: FakeHub, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    length_bomb(tmp_path / "long" / "lora.safetensors", 92_000_000, 92_000_100)
    scalar_bomb(tmp_path / "many" / "lora.safetensors", MAX_TENSORS + 1)
    fake_hub.add_repo("me/long", tmp_path / "long")
    fake_hub.add_repo("me/many", tmp_path / "many")
    refuse_json_parsing(monkeypatch)

    with pytest.raises(H3AppError, match="92,000,000-byte header"):
        read_header("me/long")
    long_reads = fake_hub.requests_for("me/long", "lora.safetensors")
    assert sum(r.sent_bytes for r in long_reads) <= 100_001 and not any(r.is_full_get for r in long_reads)

    with pytest.raises(H3AppError, match="tensors"):
        read_header("me/many")
    assert not any(r.is_full_get for r in fake_hub.requests_for("me/many", "lora.safetensors"))


# ---------------------------------------------------------------------------------------------------------------
# No file-existence oracle in hosted mode
# ---------------------------------------------------------------------------------------------------------------
def hosted_answer(source: str, weight_name: str | None, allowed: list[str]) -> str:
    """What a hosted server answers to Inspect: the panel's implied weight name, then the parse."""
    try:
        parse_source(source, implied_weight(source, weight_name, allowed_local_dirs=allowed), None,
                     allowed_local_dirs=allowed)
    except H3AppError as error:
        return str(error).replace(short(source), "<path>")  # the refusal echoes the path as typed, cut
    return "accepted"


@pytest.mark.parametrize("weight_name", ["shadow", "secret.safetensors", None, "x.bin"])
def test_an_existing_and_a_missing_path_outside_the_allowed_folders_get_the_same_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, weight_name: str | None) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    private = tmp_path / "private"
    private.mkdir()
    existing = private / "shadow"
    existing.write_text("root:*:")
    (private / "secret.safetensors").write_bytes(b"x" * 16)
    missing = private / "nothing-here"

    touched: list[str] = []
    for name in ("exists", "is_file", "is_dir", "stat", "iterdir"):
        real = getattr(Path, name)

        def spy(self, *args, _real=real, **kwargs):
            touched.append(str(self))
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(Path, name, spy)

    monkeypatch.chdir(allowed)
    answers = {hosted_answer(str(path), weight_name, [str(allowed)])
               for path in (existing, missing, private / "secret.safetensors", private)}
    answers |= {hosted_answer(f"../private/{name}", weight_name, [str(allowed)]) for name in ("shadow", "nothing-here")}
    assert len(answers) == 1 and "not allowed on this server" in answers.pop()
    assert not [p for p in touched if "private" in p]  # nothing outside the allowed folder was looked at
