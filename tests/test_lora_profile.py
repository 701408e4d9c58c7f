"""Strength profile: ‖scale·B·A‖_F/‖W‖_F without forming B·A, its summaries, and the rank-fallback alpha warning."""

import dataclasses
import math

import pytest
import torch
from lora_fixtures import block_targets, build_tiny, linear_shapes, make_adapter

from h3app.lora import LoRAEngine
from h3app.lora.profile import USUAL_RELATIVE_UPDATE, block_of, suggest_alpha, update_norm, weight_norm
from h3app.settings import LoRASettings


@pytest.mark.parametrize("rank,out_f,in_f", [(4, 30, 20), (64, 12, 9), (1, 5, 7)])
def test_update_norm_equals_the_frobenius_norm_of_B_A(rank, out_f, in_f):
    g = torch.Generator().manual_seed(rank)
    A, B = torch.randn(rank, in_f, generator=g), torch.randn(out_f, rank, generator=g)
    assert math.isclose(update_norm(A, B), float(torch.linalg.norm(B.double() @ A.double())), rel_tol=1e-5)
    W = torch.randn(out_f, in_f, generator=g).to(torch.bfloat16)
    assert math.isclose(weight_norm(W), float(torch.linalg.norm(W.double())), rel_tol=1e-9)


def test_block_of():
    assert block_of("transformer_blocks.12.attn.to_q") == "transformer_blocks.12"
    assert block_of("token_refiner.refiner_blocks.1.ff.net.2") == "token_refiner.refiner_blocks.1"
    assert block_of("proj_out") == "global"


def test_report_profile_matches_direct_computation():
    model = build_tiny()
    shapes = linear_shapes(model)
    targets = block_targets(shapes) + ["norm_out.linear"]
    adapter = make_adapter(shapes, targets, rank=4, alpha=2.0)
    weights = {name: m.weight.detach().clone() for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    engine = LoRAEngine(model)
    report = engine.attach(adapter, LoRASettings(source="s", strength=-0.5, group_strengths={"adaln": 3.0}), "a")
    profile = report.profile
    for target in ("transformer_blocks.1.attn.to_v", "norm_out.linear"):
        module = adapter.modules[target]
        scale = 2.0 * -0.5 * (3.0 if target == "norm_out.linear" else 1.0) / 4
        direct = float(torch.linalg.norm(scale * module.up.double() @ module.down.double()) / torch.linalg.norm(weights[target].double()))
        assert math.isclose(profile.to_json()["targets"][target], direct, rel_tol=1e-5)
    assert set(profile.per_group) == {"attention", "feed_forward", "refiner", "adaln"}
    assert set(profile.per_block) == {"transformer_blocks.0", "transformer_blocks.1", "token_refiner.refiner_blocks.0",
                                      "token_refiner.refiner_blocks.1", "global"}
    assert profile.per_group["adaln"].count == 1 and profile.overall.count == len(targets)
    # the profile follows set_lora without re-reading factors
    engine.set_lora("a", strength=-1.0)
    assert math.isclose(engine.report("a").profile.overall.median, 2 * profile.overall.median, rel_tol=1e-12)


def _lightx2v_like(model, *, at_alpha_8: float):
    """A rank-128 adapter whose every target changes its weight by ``at_alpha_8`` (relative) at alpha 8."""
    shapes = linear_shapes(model)
    adapter = make_adapter(shapes, block_targets(shapes), rank=128, alpha=None)
    modules = {}
    for target, module in adapter.modules.items():
        weight = model.get_submodule(target).weight
        relative_at_8 = (8 / 128) * update_norm(module.down, module.up) / weight_norm(weight)
        modules[target] = dataclasses.replace(module, up=module.up * (at_alpha_8 / relative_at_8))
    return dataclasses.replace(adapter, modules=modules)


def test_rank_fallback_warning_names_the_alpha_for_a_lightx2v_like_adapter():
    model = build_tiny()
    adapter = _lightx2v_like(model, at_alpha_8=4e-3)  # well scaled at alpha 8; 16x that at alpha = rank = 128
    report = LoRAEngine(model).attach(adapter, LoRASettings(source="lightx2v-like"), "turbo")
    warnings = [w for w in report.warnings if "no alpha stored" in w]
    assert len(warnings) == 1
    assert "median relative update ‖ΔW‖/‖W‖ is 0.064" in warnings[0]
    assert "alpha 8 (any alpha in 2-20)" in warnings[0]
    assert math.isclose(report.profile.overall.median, 0.064, rel_tol=1e-4)


@pytest.mark.parametrize("how", ["stored_alpha_8", "explicit_alpha_8"])
def test_no_warning_at_alpha_8(how):
    model = build_tiny()
    adapter = _lightx2v_like(model, at_alpha_8=4e-3)
    if how == "stored_alpha_8":
        adapter = dataclasses.replace(adapter, modules={
            t: dataclasses.replace(m, alpha=8.0, alpha_source="metadata") for t, m in adapter.modules.items()})
        settings = LoRASettings(source="s")
    else:
        settings = LoRASettings(source="s", alpha=8)
    report = LoRAEngine(model).attach(adapter, settings, "turbo")
    assert not [w for w in report.warnings if "no alpha stored" in w]
    low, high = USUAL_RELATIVE_UPDATE
    assert low <= report.profile.overall.median <= high


def test_no_warning_for_a_well_scaled_alpha_equals_rank_adapter():
    # Larry-style: trained at alpha = rank, small factors: the fallback is right and must not be flagged.
    model = build_tiny()
    adapter = _lightx2v_like(model, at_alpha_8=4e-3 / 16)
    report = LoRAEngine(model).attach(adapter, LoRASettings(source="s"), "larry")
    assert not [w for w in report.warnings if "no alpha stored" in w]


def test_suggest_alpha_with_mixed_ranks_is_linear_in_alpha():
    # u = update/weight: 0.5 for rank 64 targets, 0.25 for rank 16 ones; at alpha = rank every module has scale 1.
    suggestion = suggest_alpha({"a": 0.5, "b": 0.5, "c": 0.25}, {"a": 1.0, "b": 1.0, "c": 1.0},
                               {"a": 64, "b": 64, "c": 16}, {"a": 64.0, "b": 64.0, "c": 16.0})
    assert suggestion is not None and suggestion.median_at_rank == 0.5
    per_unit = 0.5 / 64  # median of u/rank over a, b, c = (0.0078125, 0.0078125, 0.015625)
    assert math.isclose(suggestion.low, 1e-3 / per_unit) and math.isclose(suggestion.high, 1e-2 / per_unit)
    assert suggestion.suggested == 0.5


@pytest.mark.parametrize("rank,out_f,in_f", [(9, 12, 9), (20, 12, 9), (21, 12, 9)])
def test_update_norm_uses_no_gram_matrix_at_a_rank_of_min_in_out_or_more(rank, out_f, in_f, monkeypatch):
    from h3app.lora import profile

    def no_gram(*_):
        raise AssertionError("r x r Gram matrices at a rank >= min(in, out)")

    monkeypatch.setattr(profile, "_gram_squared", no_gram)
    g = torch.Generator().manual_seed(rank)
    A, B = torch.randn(rank, in_f, generator=g), torch.randn(out_f, rank, generator=g)
    assert math.isclose(update_norm(A, B), float(torch.linalg.norm(B.double() @ A.double())), rel_tol=1e-5)


def test_a_rank_above_in_plus_out_is_refused_at_attach_and_nothing_changes():
    from lora_fixtures import state_hash

    from h3app.adapters.fit import RANK_FLOOR
    from h3app.errors import H3AppError

    model = build_tiny()
    shapes = linear_shapes(model)
    targets = block_targets(shapes)
    hostile = "transformer_blocks.0.attn.to_q"
    out_f, in_f = shapes[hostile]
    limit = max(out_f + in_f, RANK_FLOOR)
    adapter = make_adapter(shapes, targets, rank={t: (limit + 1 if t == hostile else 4) for t in targets}, alpha=4.0)
    before = state_hash(model)
    engine = LoRAEngine(model)
    with pytest.raises(H3AppError) as refused:
        engine.attach(adapter, LoRASettings(source="s"), "hostile")
    message = str(refused.value)
    assert "\n" not in message and f"rank {limit + 1}, above the limit {limit}" in message
    assert hostile in message and "nothing was applied" in message
    assert state_hash(model) == before and not engine.active()
    # a rank between min(in, out) and in + out is accepted and measured without Gram matrices
    adapter = make_adapter(shapes, targets, rank={t: (limit if t == hostile else 4) for t in targets}, alpha=4.0)
    report = engine.attach(adapter, LoRASettings(source="s"), "wide")
    module = adapter.modules[hostile]
    direct = 4.0 / limit * float(torch.linalg.norm(module.up.double() @ module.down.double()) / torch.linalg.norm(
        model.get_submodule(hostile).base.weight.double()))
    assert math.isclose(report.profile.to_json()["targets"][hostile], direct, rel_tol=1e-5)


def test_the_profile_is_measured_on_first_request_and_memoised_per_adapter(monkeypatch):
    from h3app.lora import profile as profile_module

    calls = {"update": 0, "weight": 0}
    update, weight = profile_module.update_norm, profile_module.weight_norm

    def counting_update(*args):
        calls["update"] += 1
        return update(*args)

    def counting_weight(*args):
        calls["weight"] += 1
        return weight(*args)

    monkeypatch.setattr(profile_module, "update_norm", counting_update)
    monkeypatch.setattr(profile_module, "weight_norm", counting_weight)
    model = build_tiny()
    shapes = linear_shapes(model)
    targets = block_targets(shapes)
    adapter = make_adapter(shapes, targets, rank=4, alpha=4.0)
    engine = LoRAEngine(model)
    attached = engine.attach(adapter, LoRASettings(source="s"), "a")
    assert calls == {"update": 0, "weight": 0}  # attach binds; it measures nothing
    first = engine.report("a").profile
    assert calls == {"update": len(targets), "weight": len(targets)}
    assert attached.profile.to_json() == first.to_json()  # the attach report measures on access, from the memo
    engine.set_lora("a", strength=0.5)
    engine.detach("a")
    engine.attach(adapter, LoRASettings(source="s"), "a")  # the same adapter again: nothing to measure
    assert engine.report("a").profile.to_json() == first.to_json()
    assert calls == {"update": len(targets), "weight": len(targets)}
    other = make_adapter(shapes, targets, rank=4, alpha=4.0, seed=5)
    engine.attach(other, LoRASettings(source="s"), "b")
    engine.report("b")
    assert calls == {"update": 2 * len(targets), "weight": len(targets)}  # weight norms are per model target
