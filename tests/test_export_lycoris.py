"""Export of LoKr, LoHa and DoRA to a plain PEFT LoRA: where it is exact (LoKr/LoHa pairs; a DoRA at one strength,
from the base weights, full-rank), PEFT loading the file applies the formula computed independently; otherwise the
export is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from adapter_fixtures import TINY_SHAPES, oracle_deltas_peft, relative_error
from cli_runner import run_cli
from dora_fixtures import PEFT_TARGETS, dora_weight, peft_dora_file
from lycoris_fixtures import kind_file

from h3app.adapters.export import export_adapter
from h3app.adapters.normalise import load_adapter
from h3app.model.base_weights import read_base_weights


@pytest.mark.slow
@pytest.mark.parametrize("kind,options", [("lokr", dict(rank=2, whole_w1=False)), ("lokr", dict(rank=None)),
                                          ("loha", dict(rank=3))], ids=["lokr", "lokr-whole", "loha"])
def test_lokr_and_loha_export_exactly(kind: str, options: dict, tmp_path: Path) -> None:
    path, expected = kind_file(tmp_path / "k.safetensors", kind, "lora_unet", alpha=3.0, **options)
    result = export_adapter(load_adapter(path, shapes=TINY_SHAPES), tmp_path / "out", strength=0.7)
    assert "no approximation" in result.note
    got = oracle_deltas_peft(result.weights.parent, strip="transformer.")
    assert set(got) == set(expected)
    for target, reference in expected.items():
        assert relative_error(got[target], 0.7 * reference) < 1e-6, target


@pytest.mark.slow
def test_dora_exports_at_one_strength_from_the_base_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    weights = {t: w for t, w in zip(PEFT_TARGETS, read_base_weights("tiny", [f"{t}.weight" for t in PEFT_TARGETS]).values())}
    path, factors = peft_dora_file(tmp_path / "dora.safetensors", weights, rank=2, alpha=4.0)
    code, _, err = run_cli(capsys, "export", "--adapter", str(path), "--out", str(tmp_path / "refused"), "--scale", "0.5")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "give --model" in err
    assert not (tmp_path / "refused" / "adapter_model.safetensors").exists()
    code, out, _ = run_cli(capsys, "export", "--adapter", str(path), "--model", "tiny", "--scale", "0.5",
                           "--out", str(tmp_path / "out"), "--json")
    payload = json.loads(out)
    assert code == 0 and "DoRA baked at strength 0.5" in payload["note"] and "max relative error" in payload["note"]
    got = oracle_deltas_peft(tmp_path / "out", strip="transformer.")
    for target, (down, up, magnitude) in factors.items():
        reference = dora_weight(weights[target], down, up, magnitude, 4.0 / 2 * 0.5) - weights[target].double()
        assert relative_error(got[target], reference) < 1e-5, target
