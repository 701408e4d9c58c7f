"""The embedded checkpoint: real layout, reproducible from the script, small, and named by its own repo id."""

import hashlib
import json
from pathlib import Path

import pytest

from h3app.model import repo
from h3app.model.tiny import TINY_REPO_ID, TINY_TRANSFORMER_CONFIG, build

REAL_LAYOUT = ("transformer", "transformer_ref", "vae", "audio_vae", "scheduler", "audio_scheduler",
               "text_encoder", "tokenizer", "processor")


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


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


@pytest.mark.slow
def test_committed_checkpoint_is_reproducible_from_the_script(tmp_path):
    rebuilt = build(tmp_path / "tiny-h3")
    assert _digest(rebuilt) == _digest(repo.TINY_DIR)
