"""The embedded checkpoint: real layout, rebuilt by the training recipe, small, and named by its own repo id."""

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from h3app.model import repo
from h3app.model.tiny import TINY_TRANSFORMER_CONFIG, build, checkpoint
from h3app.model.tiny_training.recipe import STYLE_FILE, TURBO_FILE, TURBO_RANK, Recipe, train
from h3app.rules.choices import TINY_REPO_ID

REAL_LAYOUT = ("transformer", "transformer_ref", "vae", "audio_vae", "scheduler", "audio_scheduler",
               "text_encoder", "tokenizer", "processor")


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_layout_matches_the_real_repo():
    index = json.loads((repo.TINY_DIR / "modular_model_index.json").read_text())
    assert index["_class_name"] == "MiniMaxH3ModularPipeline"
    for component in REAL_LAYOUT:
        assert (repo.TINY_DIR / component).is_dir(), component
        spec = index[component][2]
        assert spec["pretrained_model_name_or_path"] == TINY_REPO_ID
        assert spec["subfolder"] == component
    assert str(repo.TINY_DIR.parent) not in json.dumps(index), "absolute build path leaked into the index"
    assert index["canvas_short_edge"] <= 128 and index["canvas_max_pixels"] <= 128 * 128


def test_size_under_ten_megabytes():
    size = sum(p.stat().st_size for p in repo.TINY_DIR.rglob("*") if p.is_file())
    assert size < 10_000_000


def test_transformer_config_is_the_tiny_one():
    config = repo.read_transformer_config("tiny")
    for key, value in TINY_TRANSFORMER_CONFIG.items():
        assert config[key] == (list(value) if isinstance(value, tuple) else value), key
    # in ≠ out, like the real model: 7168-wide attention vs 5376 hidden becomes 32 vs 24 here
    assert config["num_attention_heads"] * config["attention_head_dim"] != config["hidden_size"]


def test_build_writes_the_untrained_starting_point_in_the_same_layout(tmp_path):
    built = build(tmp_path / "tiny-h3")
    assert _files(built) == _files(repo.TINY_DIR)
    assert json.loads((built / "modular_model_index.json").read_text()) == json.loads(
        (repo.TINY_DIR / "modular_model_index.json").read_text())


@pytest.mark.slow
def test_training_recipe_smoke_run_writes_checkpoint_and_both_loras(tmp_path):
    """One or two optimiser steps per stage: every line of the recipe runs (the committed run is docs/demo.md's)."""
    out, adapters = tmp_path / "tiny-h3", tmp_path / "adapters"
    lines = []
    train(checkpoint(), out, adapters, tmp_path / "work", Recipe.smoke(), log=lambda *args: lines.append(args))
    assert _files(out) == _files(repo.TINY_DIR)
    assert {stage for stage, *_ in lines} == {"base", "style", "teacher", "turbo"}
    with safe_open(str(adapters / TURBO_FILE), "pt") as turbo:
        keys = list(turbo.keys())
        assert not turbo.metadata() or "lora_adapter_metadata" not in turbo.metadata()
        assert keys and all(k.endswith(("lora_A.default.weight", "lora_B.default.weight")) for k in keys)
        assert {turbo.get_slice(k).get_shape()[0] for k in keys if "lora_A" in k} == {TURBO_RANK}
    with safe_open(str(adapters / STYLE_FILE), "pt") as style:
        assert "lora_alpha" in style.metadata()["lora_adapter_metadata"]
