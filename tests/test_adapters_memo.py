"""Repeated inspections of an unchanged file are free; a changed file, or another visitor's token, is read again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from adapter_fixtures import TINY_SHAPES
from hub_server import FakeHub
from test_adapters_source import write_adapter

from h3app.adapters import header as header_module
from h3app.adapters import memo
from h3app.adapters.formats import DIFFUSERS_MODULES, NATIVE_MODULES, match_module
from h3app.adapters.inspect import inspect_file
from h3app.adapters.source import read_header


@pytest.fixture
def header_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every local header actually read from disk (memo misses)."""
    memo.clear()
    real = header_module._read_local_header
    reads: list[str] = []

    def counted(path, adapter_config_path):
        reads.append(Path(path).name)
        return real(path, adapter_config_path)

    monkeypatch.setattr(header_module, "_read_local_header", counted)
    yield reads
    memo.clear()


def test_inspecting_an_unchanged_file_again_reads_nothing(tmp_path: Path, header_reads: list[str]) -> None:
    path = write_adapter(tmp_path / "lora.safetensors", {0: 8.0, 1: 4.0})
    first = inspect_file(path, shapes=None)
    again = inspect_file(path, shapes=None)
    assert again is first and header_reads == ["lora.safetensors"]


def test_a_rewritten_file_or_a_new_adapter_config_is_read_again(tmp_path: Path, header_reads: list[str]) -> None:
    path = write_adapter(tmp_path / "lora.safetensors", {0: 8.0})
    assert inspect_file(path).alpha == 8.0
    write_adapter(path, {0: 2.0, 1: 2.0})
    assert inspect_file(path).alpha == 2.0
    (tmp_path / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 3}')
    info = inspect_file(path)
    assert header_reads == ["lora.safetensors"] * 3
    assert "alpha 2 from the module's .alpha tensor wins over alpha 3 from adapter_config.json" in " ".join(info.warnings)
    os.utime(path, ns=(1, 1))  # same bytes, another version: read again rather than trusted
    inspect_file(path)
    assert len(header_reads) == 4


def test_inspecting_with_other_options_analyses_again_from_the_remembered_header(
        tmp_path: Path, header_reads: list[str]) -> None:
    path = write_adapter(tmp_path / "lora.safetensors", {0: 8.0})
    plain = inspect_file(path)
    explicit = inspect_file(path, explicit_alpha=5.0)
    assert (plain.alpha, explicit.alpha) == (8.0, 5.0) and header_reads == ["lora.safetensors"]


def test_a_hub_header_is_read_once_per_commit_and_token(fake_hub: FakeHub, tmp_path: Path) -> None:
    folder = tmp_path / "repo"
    write_adapter(folder / "lora.safetensors", {0: 8.0}, in_features=4096)
    fake_hub.add_repo("me/memo", folder)

    first = read_header("me/memo")
    ranged = [r for r in fake_hub.requests_for("me/memo", "lora.safetensors") if r.range]
    fake_hub.clear_log()
    assert read_header("me/memo") is first
    assert not [r for r in fake_hub.requests_for("me/memo", "lora.safetensors") if r.range]  # only the listing

    read_header("me/memo", token="hf_other_visitor")  # another visitor's access is checked by reading again
    assert len([r for r in fake_hub.requests_for("me/memo", "lora.safetensors") if r.range]) == len(ranged)


@pytest.mark.parametrize("flat", [False, True])
def test_the_compiled_alternation_picks_the_same_rule_as_trying_each_in_turn(flat: bool) -> None:
    import re

    names = [name for name in (*TINY_SHAPES.linears, "blocks.1.attn.qkv_proj", "blocks.0.mlp.fc1",
                                "token_refiner.blocks.1.attn.out_proj", "final_layer.video_out", "blocks.1.attn1.to_q",
                                "transformer_blocks.0.attn.to_qkv", "nothing")]
    for name in names:
        text = name.replace(".", "_") if flat else name
        expected = None
        for family, table in (("native", NATIVE_MODULES), ("diffusers", DIFFUSERS_MODULES)):
            for rule in table:
                pattern = rule.pattern.replace(r"\.", "_") if flat else rule.pattern
                found = re.fullmatch(pattern, text)
                if found and expected is None:
                    expected = (family, rule, found.groups())
        got = match_module(text, flat)
        assert (got and (got[0], got[1], got[2].groups())) == (expected or None), name
