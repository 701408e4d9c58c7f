"""Fused-QKV mode: split q/k/v adapters as a stacked 3D delta on ``attn.to_qkv``, a shared-A (native fused) adapter
as 2D; both match the unfused model within fp32 tolerance, in unmerged and merged mode."""

import pytest
import torch
from lora_fixtures import (
    block_targets,
    build_tiny,
    forward,
    linear_shapes,
    make_adapter,
    max_rel_err,
    module_types,
    same_bits,
    state_hash,
)

from h3app.backend.transformer_check import packed_check_input
from h3app.lora import LoRAEngine
from h3app.settings import LoRASettings


@pytest.fixture(scope="module")
def setup():
    unfused = build_tiny()
    return linear_shapes(unfused), packed_check_input(unfused.config, seed=3)


def _compare(adapter, inputs, mode="unmerged", **settings):
    results = []
    for fused in (False, True):
        model = build_tiny(fused=fused)
        engine = LoRAEngine(model)
        engine.attach(adapter, LoRASettings(source="s", mode=mode, **settings), "a")
        results.append((forward(model, inputs), engine))
    return results


def test_fused_model_exposes_canonical_targets_on_to_qkv(setup):
    engine = LoRAEngine(build_tiny(fused=True))
    slot = engine.targets["transformer_blocks.1.attn.to_k"]
    assert engine.fused_qkv
    assert (slot.module, slot.index, slot.groups, slot.out_features) == ("transformer_blocks.1.attn.to_qkv", 1, 3, 32)
    shapes, _ = setup
    assert set(engine.targets) == set(shapes)  # same canonical vocabulary as the unfused model


@pytest.mark.parametrize("mode", ["unmerged", "merged"])
@pytest.mark.parametrize(
    "case", ["split_qkv", "q_and_v_only", "unequal_ranks", "shared_A_native"],
)
def test_fused_matches_unfused(setup, mode, case):
    shapes, inputs = setup
    suffixes = ("attn.to_q", "attn.to_v", "ff.net.2") if case == "q_and_v_only" else None
    targets = block_targets(shapes, suffixes) if suffixes else block_targets(shapes)
    rank = 4
    if case == "unequal_ranks":
        rank = {t: (2 if t.endswith("to_q") else 6 if t.endswith("to_k") else 4) for t in targets}
    adapter = make_adapter(shapes, targets, rank=rank, alpha=None, shared_qkv_down=case == "shared_A_native")
    (unfused_out, _), (fused_out, fused_engine) = _compare(adapter, inputs, mode=mode, alpha=8.0, strength=0.9)
    assert max_rel_err(fused_out, unfused_out) < 2e-5
    entry = fused_engine._adapters["a"].entries["transformer_blocks.0.attn.to_qkv"]
    assert entry.stacked == (case != "shared_A_native")
    if case == "q_and_v_only":
        assert entry.group_ranks == (4, 0, 4)


@pytest.mark.parametrize("mode", ["unmerged", "merged"])
def test_equivalence_pair_bit_identical_in_fused_mode(setup, mode):
    shapes, inputs = setup
    targets = block_targets(shapes)
    rank = {t: (16 if t.endswith("to_k") else 4) for t in targets}  # mixed ranks inside one stack
    model = build_tiny(fused=True)
    engine = LoRAEngine(model)
    engine.attach(make_adapter(shapes, targets, rank=rank, alpha=None), LoRASettings(source="s", alpha=8, mode=mode), "a")
    first = forward(model, inputs)
    engine.set_lora("a", alpha=128, strength=0.0625)
    assert same_bits(forward(model, inputs), first)


def test_detach_in_fused_mode_restores_base(setup):
    shapes, inputs = setup
    model = build_tiny(fused=True)
    before, types, out = state_hash(model), module_types(model), forward(model, inputs)
    engine = LoRAEngine(model)
    engine.attach(make_adapter(shapes, block_targets(shapes), rank=4, alpha=4.0), LoRASettings(source="s", mode="merged"), "a")
    engine.set_mode("unmerged")
    engine.set_mode("merged")
    engine.detach()
    assert state_hash(model) == before and module_types(model) == types
    assert same_bits(forward(model, inputs), out)


def test_group_scales_follow_each_ranks_own_alpha_over_rank():
    model = build_tiny(fused=True)
    shapes = linear_shapes(build_tiny())
    q, k = "transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k"
    adapter = make_adapter(shapes, [q, k], rank={q: 2, k: 8}, alpha={q: 4.0, k: 4.0})
    engine = LoRAEngine(model)
    engine.attach(adapter, LoRASettings(source="s", strength=0.5), "a")
    entry = engine._adapters["a"].entries["transformer_blocks.0.attn.to_qkv"]
    assert entry.scale_values() == (4.0 * 0.5 / 2, 4.0 * 0.5 / 8, 0.0)
    assert entry.down.shape == (3, 8, 24) and entry.up.shape == (3, 32, 8)
    assert torch.count_nonzero(entry.down[0, 2:]) == 0  # q's rank 2 zero-padded to 8
