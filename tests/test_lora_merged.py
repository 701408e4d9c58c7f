"""Merged mode's pristine copies: host RAM or a local safetensors file mapped from disk (bitwise the same results),
refused with the reason when neither fits, and refused for quantised bases."""

import pytest
import torch

from h3app.backend.transformer_check import packed_check_input
from h3app.errors import H3AppError
from h3app.lora import LoRAEngine, PristineStore
from h3app.lora.layers import is_mergeable
from h3app.settings import LoRASettings
from lora_fixtures import block_targets, build_tiny, forward, linear_shapes, make_adapter, module_types, state_hash


@pytest.fixture(scope="module")
def setup():
    model = build_tiny()
    shapes = linear_shapes(model)
    return make_adapter(shapes, block_targets(shapes) + ["proj_out"], rank=4, alpha=4.0), packed_check_input(model.config, 1)


def test_disk_spilled_pristine_gives_bitwise_the_ram_results(setup, tmp_path):
    adapter, inputs = setup
    outputs, states = [], []
    for store in (PristineStore(prefer="ram"), PristineStore(tmp_path, prefer="disk")):
        model = build_tiny()
        base = state_hash(model)
        engine = LoRAEngine(model, pristine=store)
        engine.attach(adapter, LoRASettings(source="s", mode="merged", strength=0.8), "a")
        engine.set_lora("a", alpha=64, strength=-0.3)
        engine.set_lora("a", alpha=None, strength=0.8)
        outputs.append(forward(model, inputs))
        states.append(state_hash(model))
        if store.prefer == "disk":
            files = list(tmp_path.rglob("*.safetensors"))
            assert len(files) == len(engine._adapters["a"].entries) and store.ram_bytes == 0
        engine.detach()
        assert state_hash(model) == base
        if store.prefer == "disk":
            assert not list(tmp_path.rglob("*.safetensors"))
    assert states[0] == states[1]
    assert all(torch.equal(a, b) for a, b in zip(*outputs))


def test_auto_spills_to_disk_when_ram_is_short(setup, tmp_path):
    adapter, _ = setup
    store = PristineStore(tmp_path, available_ram=lambda: 1 << 20)  # 1 MiB free: below the margin
    engine = LoRAEngine(build_tiny(), pristine=store)
    engine.attach(adapter, LoRASettings(source="s", mode="merged"), "a")
    assert store.disk_keys and store.ram_bytes == 0


def test_merged_refused_when_neither_ram_nor_disk_fits(setup, tmp_path):
    adapter, inputs = setup
    model = build_tiny()
    before, types = state_hash(model), module_types(model)
    store = PristineStore(tmp_path, available_ram=lambda: 1 << 20, free_disk=lambda path: 1 << 20)
    engine = LoRAEngine(model, pristine=store)
    with pytest.raises(H3AppError, match="merged mode needs .* GiB for the pristine weights, but host RAM .* are both too small"):
        engine.attach(adapter, LoRASettings(source="s", mode="merged"), "a")
    assert state_hash(model) == before and module_types(model) == types and engine.active() == {}
    engine.attach(adapter, LoRASettings(source="s"), "a")  # unmerged needs no copy
    with pytest.raises(H3AppError, match="use unmerged mode"):
        engine.set_mode("merged")
    assert engine.mode == "unmerged" and len(store) == 0
    assert forward(model, inputs)[0].isfinite().all()


def test_quantised_or_meta_weights_are_unmerged_only():
    int8 = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.int8), requires_grad=False)
    assert "unmerged-only" in is_mergeable(int8)
    assert "meta device" in is_mergeable(torch.empty(2, 2, device="meta"))
    assert is_mergeable(torch.zeros(2, 2, dtype=torch.bfloat16)) is None
