"""h3app.model.tiny_training.demo_adapters and assets/adapters: deterministic, up to date, small, and each one its intended layout."""

from __future__ import annotations

from pathlib import Path

import pytest
from adapter_fixtures import TINY_SHAPES

from h3app.adapters.inspect import inspect_file
from h3app.adapters.normalise import load_adapter
from h3app.model.tiny_training.demo_adapters import main, write_demo_adapters
from h3app.model.tiny_training.recipe import STYLE_FILE, TURBO_FILE

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "adapters"
EXPECTED = {
    "native_larry_mixed_rank.safetensors": ("native", "rank_fallback", None),
    "native_comfyui_alpha.safetensors": ("native", "module_tensor", 2.0),
    "kohya_musubi.safetensors": ("kohya", "module_tensor", 1.5),
    "diffsynth_interleaved.safetensors": ("diffsynth", "rank_fallback", 4.0),
    "peft_diffusers_metadata.safetensors": ("peft", "metadata", None),
    "lightx2v_turbo_no_alpha.safetensors": ("peft", "rank_fallback", 128.0),
    "peft_rslora/adapter_model.safetensors": ("peft", "adapter_config", None),
}


TRAINED = (TURBO_FILE, STYLE_FILE)  # written by `python -m h3app.model.tiny train`, checked in test_demo_trained.py


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_demo_is_deterministic_and_assets_are_up_to_date(tmp_path: Path) -> None:
    written = write_demo_adapters(tmp_path / "a")
    assert sorted(str(p.relative_to(tmp_path / "a")) for p in written) == sorted(EXPECTED)
    assert main([str(tmp_path / "b")]) == 0
    first, second = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert first == second
    written_here = {name: data for name, data in _files(ASSETS).items() if name not in TRAINED}
    assert written_here == first, "assets/adapters is stale: run `python -m h3app.model.tiny_training.demo_adapters assets/adapters`"
    assert sum(len(data) for data in first.values()) < 2_000_000


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_demo_is_its_layout_and_loads_on_the_tiny_model(name: str) -> None:
    fmt, alpha_source, alpha = EXPECTED[name]
    info = inspect_file(ASSETS / name, shapes=TINY_SHAPES)
    assert (info.format, info.alpha_source, info.alpha) == (fmt, alpha_source, alpha)
    assert info.unmatched_keys == ()
    adapter = load_adapter(ASSETS / name, shapes=TINY_SHAPES)
    assert len(adapter.modules) == info.num_targets > 0
    assert all(module.up.abs().max() > 0 for module in adapter.modules.values())
