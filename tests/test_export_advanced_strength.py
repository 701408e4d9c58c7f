"""Export with advanced strength: per-block factors are baked into the exported alphas (PEFT applies them), a
strength schedule or per-modality strength is refused in one line (a LoRA file cannot hold them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from adapter_fixtures import TINY_SHAPES, delta, native_block, oracle_deltas_peft, relative_error, save
from cli_runner import assert_one_line, run_cli

from h3app.adapters.export import export_adapter
from h3app.adapters.normalise import load_adapter
from h3app.errors import H3AppError
from h3app.settings import LoRASettings


def _adapter(tmp_path: Path):
    tensors = native_block("", 0, rank=4) | native_block("", 1, rank=4)
    return load_adapter(save(tmp_path / "two_blocks.safetensors", tensors), shapes=TINY_SHAPES)


@pytest.mark.slow
def test_block_strength_is_baked_and_peft_applies_it(tmp_path):
    adapter = _adapter(tmp_path)
    advanced = LoRASettings(source="x", block_strength="1:3")
    result = export_adapter(adapter, tmp_path / "out", strength=0.5, advanced=advanced)
    assert result.block_strength == "1:3" and result.to_json()["block_strength"] == "1:3"
    applied = oracle_deltas_peft(result.weights.parent, strip="transformer.")
    for target, module in adapter.modules.items():
        factor = 3.0 if target.startswith("transformer_blocks.1.") else 1.0
        assert relative_error(applied[target], factor * delta(module, 0.5)) <= 1e-6, target


@pytest.mark.parametrize("fields, words", [
    ({"strength_schedule": "1,0.5"}, "strength schedule .* cannot hold"),
    ({"audio_strength": 0.0}, "per-modality strength .* cannot hold"),
])
def test_a_schedule_or_a_modality_strength_is_refused(tmp_path, fields, words):
    with pytest.raises(H3AppError, match=words):
        export_adapter(_adapter(tmp_path), tmp_path / "out", advanced=LoRASettings(source="x", **fields))
    assert not (tmp_path / "out").exists()


def test_cli_export_refuses_before_fetching(capsys, tmp_path):
    result = run_cli(capsys, "export", "--adapter", str(tmp_path / "missing.safetensors"), "--out",
                     str(tmp_path / "out"), "--strength-schedule", "linear:1:0")
    assert result.code == 2
    assert_one_line(result.err, "strength schedule")
