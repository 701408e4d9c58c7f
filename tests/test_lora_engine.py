"""LoRAEngine on the tiny transformer (fp32): the equivalence pair, re-apply, detach, transactions, two adapters,
group and negative strengths, reports."""

import math
import random

import pytest
import torch
from lora_fixtures import (
    block_targets,
    build_tiny,
    fail_merge_at,
    forward,
    linear_shapes,
    make_adapter,
    max_rel_err,
    module_types,
    same_bits,
    state_hash,
)

from h3app.backend.transformer_check import packed_check_input
from h3app.errors import H3AppError
from h3app.lora import LoRAEngine, LoRALinear, MatchError
from h3app.lora.layers import LoRAFactors
from h3app.lora.scaling import AdapterScale, ModuleAlpha
from h3app.settings import LoRASettings

RANKS = {"rank4": 4, "rank16": 16, "mixed": "mixed"}


@pytest.fixture(scope="module")
def tiny_setup():
    model = build_tiny()
    shapes = linear_shapes(model)
    return shapes, packed_check_input(model.config, seed=0)


def _rank_spec(spec, targets):
    if spec != "mixed":
        return spec
    return {t: (16 if ".attn." in t else 4 if ".ff." in t else 8) for t in targets}


def _adapter(shapes, rank=4, **kwargs):
    targets = [t for t in shapes if t not in ("time_embedder.linear_1",)]  # every kind of target, globals included
    return make_adapter(shapes, targets, rank=_rank_spec(rank, targets), **kwargs)


def _settings(alpha=None, strength=1.0, mode="unmerged", **kwargs):
    return LoRASettings(source="synthetic", alpha=alpha, strength=strength, mode=mode, **kwargs)


@pytest.mark.parametrize("mode", ["unmerged", "merged"])
@pytest.mark.parametrize("rank", list(RANKS.values()), ids=list(RANKS))
def test_equivalence_pair_is_bit_identical(tiny_setup, mode, rank):
    shapes, inputs = tiny_setup
    model = build_tiny()
    base = forward(model, inputs)
    engine = LoRAEngine(model)
    engine.attach(_adapter(shapes, rank, alpha=None), _settings(alpha=8, strength=1.0, mode=mode), "a")
    out_a = forward(model, inputs)
    engine.set_lora("a", alpha=128, strength=0.0625)
    out_b = forward(model, inputs)
    assert not same_bits(out_a, base)  # the adapter does something
    assert same_bits(out_a, out_b)
    engine.set_lora("a", alpha=8, strength=0.5)  # a different product must differ
    assert not same_bits(forward(model, inputs), out_a)


def test_chain_alpha_and_explicit_alpha_with_the_same_product_are_bit_identical(tiny_setup):
    shapes, inputs = tiny_setup
    model = build_tiny()
    engine = LoRAEngine(model)
    engine.attach(_adapter(shapes, 16, alpha=8.0, alpha_source="metadata"), _settings(), "a")  # auto: chain alpha 8
    auto = forward(model, inputs)
    engine.set_lora("a", alpha=128, strength=0.0625)
    assert same_bits(forward(model, inputs), auto)
    engine.set_lora("a", alpha=None, strength=1.0)  # None = back to the chain's value
    assert same_bits(forward(model, inputs), auto)
    assert engine.active()["a"].alpha is None


@pytest.mark.parametrize("rank", [4, "mixed"], ids=["rank4", "mixed"])
def test_unmerged_matches_merged(tiny_setup, rank):
    shapes, inputs = tiny_setup
    adapter = _adapter(shapes, rank, alpha=8.0)
    model = build_tiny()
    engine = LoRAEngine(model)
    engine.attach(adapter, _settings(strength=0.7), "a")
    unmerged = forward(model, inputs)
    engine.set_mode("merged")
    assert engine.mode == "merged"
    assert not any(isinstance(m, LoRALinear) for m in model.modules())  # merged: original modules, merged weights
    merged = forward(model, inputs)
    assert max_rel_err(merged, unmerged) < 1e-5
    engine.set_mode("unmerged")
    assert same_bits(forward(model, inputs), unmerged)


@pytest.mark.parametrize("mode", ["unmerged", "merged"])
def test_fifty_random_changes_then_back_is_bitwise_the_first(tiny_setup, mode):
    shapes, inputs = tiny_setup
    model = build_tiny()
    engine = LoRAEngine(model)
    engine.attach(_adapter(shapes, "mixed", alpha=None), _settings(alpha=8, strength=1.0, mode=mode), "a")
    first = forward(model, inputs)
    first_state = state_hash(model)
    rng = random.Random(1234)
    for _ in range(50):
        engine.set_lora("a", alpha=rng.choice([None, rng.uniform(0.5, 256)]), strength=rng.uniform(-3, 3),
                        group_strengths={"attention": rng.uniform(0, 2)})
    engine.set_lora("a", alpha=8, strength=1.0, group_strengths={})
    assert same_bits(forward(model, inputs), first)
    assert state_hash(model) == first_state  # merged: weights bitwise equal to the first (fresh) merge

    fresh = build_tiny()
    LoRAEngine(fresh).attach(_adapter(shapes, "mixed", alpha=None), _settings(alpha=8, strength=1.0, mode=mode), "a")
    assert state_hash(fresh) == first_state


@pytest.mark.parametrize("mode", ["unmerged", "merged"])
def test_detach_restores_base_bitwise_and_original_modules(tiny_setup, mode):
    shapes, inputs = tiny_setup
    model = build_tiny()
    base_out, base_state, base_types = forward(model, inputs), state_hash(model), module_types(model)
    engine = LoRAEngine(model)
    engine.attach(_adapter(shapes, 4, alpha=4.0), _settings(mode=mode), "a")
    engine.attach(_adapter(shapes, 16, alpha=8.0, seed=7), _settings(mode=mode), "b")
    engine.set_lora("a", strength=-2.0)
    assert engine.mode == mode
    assert state_hash(model) != base_state or module_types(model) != base_types
    engine.detach("a")
    assert set(engine.active()) == {"b"}
    only_b = forward(model, inputs)
    fresh = build_tiny()
    LoRAEngine(fresh).attach(_adapter(shapes, 16, alpha=8.0, seed=7), _settings(mode=mode), "b")
    assert same_bits(forward(fresh, inputs), only_b)  # detaching one leaves exactly the other
    engine.detach()
    assert engine.active() == {}
    assert state_hash(model) == base_state
    assert module_types(model) == base_types
    assert same_bits(forward(model, inputs), base_out)
    assert len(engine.pristine) == 0  # no pristine copy left behind


def test_shape_error_refuses_everything_and_names_the_target(tiny_setup):
    shapes, _ = tiny_setup
    model = build_tiny()
    before, types = state_hash(model), module_types(model)
    bad_shapes = dict(shapes)
    bad_shapes["transformer_blocks.1.ff.net.2"] = (24, 31)  # in_features 31, model has 32
    adapter = make_adapter(bad_shapes, block_targets(bad_shapes), rank=4, alpha=4.0)
    engine = LoRAEngine(model)
    with pytest.raises(MatchError) as error:
        engine.attach(adapter, _settings(), "bad")
    message = str(error.value)
    assert "transformer_blocks.1.ff.net.2" in message and "A has in_features 31, the model's layer has 32" in message
    assert "nothing was applied" in message
    assert len(error.value.report.shape_errors) == 1
    assert state_hash(model) == before and module_types(model) == types
    assert engine.active() == {}


def test_zero_matches_is_an_error(tiny_setup):
    shapes, _ = tiny_setup
    model = build_tiny()
    elsewhere = {"blocks.0.attn.qkv_proj": (96, 24)}
    adapter = make_adapter(elsewhere, list(elsewhere), rank=2, alpha=2.0, unmatched_keys=("blocks.0.mlp.fc9.lora_A",))
    with pytest.raises(H3AppError, match="matched no layer of this model \\(3 keys unmatched"):
        LoRAEngine(model).attach(adapter, _settings(), "x")


def test_report_lists_matches_unmatched_keys_and_uncovered_targets(tiny_setup):
    shapes, _ = tiny_setup
    model = build_tiny()
    with_absent = dict(shapes, **{"transformer_blocks.9.attn.to_q": (32, 24)})
    targets = ["transformer_blocks.0.attn.to_q", "proj_out", "transformer_blocks.9.attn.to_q"]
    adapter = make_adapter(with_absent, targets, rank={"transformer_blocks.0.attn.to_q": 4, "proj_out": 2,
                                                        "transformer_blocks.9.attn.to_q": 4},
                           alpha=8.0, unmatched_keys=("foo.lora_A.weight",))
    report = LoRAEngine(model).attach(adapter, _settings(strength=0.5), "a")
    matched = {m.target: m for m in report.matched}
    assert set(matched) == {"transformer_blocks.0.attn.to_q", "proj_out"}
    assert matched["proj_out"].rank == 2 and matched["proj_out"].alpha == 8.0
    assert matched["proj_out"].effective_scale == 8.0 * 0.5 / 2 and matched["proj_out"].group == "input_output"
    assert matched["transformer_blocks.0.attn.to_q"].alpha_source == "metadata"
    assert report.absent_targets == ("transformer_blocks.9.attn.to_q",)
    assert report.unmatched_keys == ("foo.lora_A.weight", "transformer_blocks.9.attn.to_q.lora_A.weight",
                                     "transformer_blocks.9.attn.to_q.lora_B.weight")
    assert len(report.uncovered_targets) == len(shapes) - 2 and "proj_in" in report.uncovered_targets
    assert any("3 adapter keys matched nothing" in w for w in report.warnings)
    as_json = report.to_json()
    assert as_json["num_matched"] == 2 and as_json["profile"]["overall"]["count"] == 2
    proj_out = next(m for m in as_json["matched"] if m["target"] == "proj_out")
    assert proj_out["scale"] == 8.0 * 0.5 / 2 and "effective_scale" not in proj_out  # the JSON key stays "scale"
    assert list(as_json) == ["name", "identity", "mode", "fused_qkv", "num_matched", "matched", "unmatched_keys",
                             "absent_targets", "uncovered_targets", "shape_errors", "profile", "warnings",
                             "exact_parameters", "head_banks"]


class _Boom(RuntimeError):
    pass


def test_exception_mid_bind_leaves_base_intact(tiny_setup, monkeypatch):
    shapes, inputs = tiny_setup
    model = build_tiny()
    before, types, base_out = state_hash(model), module_types(model), forward(model, inputs)
    original = LoRALinear.add_entry
    calls = {"n": 0}

    def flaky(self, entry):
        calls["n"] += 1
        if calls["n"] == 7:
            raise _Boom("injected")
        original(self, entry)

    monkeypatch.setattr(LoRALinear, "add_entry", flaky)
    engine = LoRAEngine(model)
    with pytest.raises(_Boom):
        engine.attach(_adapter(shapes, 4, alpha=4.0), _settings(), "a")
    assert calls["n"] == 7
    assert state_hash(model) == before and module_types(model) == types
    assert engine.active() == {} and engine._layers.paths == ()
    assert same_bits(forward(model, inputs), base_out)
    monkeypatch.setattr(LoRALinear, "add_entry", original)
    engine.attach(_adapter(shapes, 4, alpha=4.0), _settings(), "a")  # the engine still works afterwards
    assert not same_bits(forward(model, inputs), base_out)


@pytest.mark.parametrize("with_other_adapter", [False, True])
def test_exception_mid_merge_leaves_weights_bitwise_as_before(tiny_setup, monkeypatch, with_other_adapter):
    shapes, inputs = tiny_setup
    model = build_tiny()
    engine = LoRAEngine(model)
    if with_other_adapter:
        engine.attach(_adapter(shapes, 4, alpha=4.0, seed=3), _settings(mode="merged"), "first")
    before, types, out_before = state_hash(model), module_types(model), forward(model, inputs)
    fail_merge_at(monkeypatch, 5, _Boom("injected"))
    with pytest.raises(_Boom):
        engine.attach(_adapter(shapes, 8, alpha=8.0), _settings(mode="merged"), "second")
    assert state_hash(model) == before and module_types(model) == types
    assert same_bits(forward(model, inputs), out_before)
    assert set(engine.active()) == ({"first"} if with_other_adapter else set())
    if not with_other_adapter:
        assert len(engine.pristine) == 0
    # a failed merged set_lora rolls back too
    if with_other_adapter:
        fail_merge_at(monkeypatch, 5, _Boom("injected"))
        with pytest.raises(_Boom):
            engine.set_lora("first", alpha=64, strength=-1.0)
        assert state_hash(model) == before
        assert engine.active()["first"].alpha is None and engine.active()["first"].strength == 1.0


def test_set_lora_costs_no_work_per_layer(tiny_setup, monkeypatch):
    shapes, inputs = tiny_setup
    model = build_tiny()
    engine = LoRAEngine(model)
    engine.attach(_adapter(shapes, 4, alpha=4.0), _settings(), "a")
    base_out = forward(model, inputs)
    fills = {"n": 0}
    original = AdapterScale._fill

    def counting(self, key, entry):
        fills["n"] += 1
        original(self, key, entry)

    monkeypatch.setattr(AdapterScale, "_fill", counting)
    engine.set_lora("a", strength=0.5)
    kinds = fills["n"]
    layers = len(engine._adapters["a"].entries)
    assert 0 < kinds < layers  # one refill per kind of layer (group, alphas, ranks), not per layer
    fills["n"] = 0
    changed = forward(model, inputs)
    assert fills["n"] == 0  # the next forward reads the shared entries: no per-layer refresh
    assert not torch.equal(changed[0], base_out[0])


def test_two_adapters_each_with_its_own_alpha_and_strength(tiny_setup):
    shapes, inputs = tiny_setup
    turbo = _adapter(shapes, 16, alpha=None)
    style = make_adapter(shapes, block_targets(shapes, ("attn.to_q", "attn.to_v")), rank=4, alpha=4.0, seed=9)
    for mode in ("unmerged", "merged"):
        model = build_tiny()
        engine = LoRAEngine(model)
        engine.attach(turbo, _settings(alpha=8, mode=mode), "turbo")
        alone = forward(model, inputs)
        engine.attach(style, _settings(strength=0.0, mode=mode), "style")
        assert same_bits(forward(model, inputs), alone)  # a second adapter at strength 0 adds exact zeros
        engine.set_lora("style", strength=0.8)
        both = forward(model, inputs)
        assert not same_bits(both, alone)
        assert engine.effective_scales("turbo")["proj_out"] == 8 / 16
        assert engine.effective_scales("style")["transformer_blocks.0.attn.to_q"] == 4 * 0.8 / 4
        engine.set_lora("turbo", alpha=128, strength=0.0625)
        assert same_bits(forward(model, inputs), both)
        if mode == "unmerged":
            reference = both
        else:
            assert max_rel_err(both, reference) < 1e-5


def test_two_adapters_on_one_layer_sum_their_deltas():
    torch.manual_seed(0)
    linear = torch.nn.Linear(6, 5).requires_grad_(False)
    layer = LoRALinear(linear)
    x = torch.randn(3, 6)
    deltas = []
    for index, (alpha, strength, rank) in enumerate([(8.0, 1.0, 2), (3.0, -0.5, 3)]):
        A, B = torch.randn(rank, 6), torch.randn(5, rank)
        state = AdapterScale((), alpha, strength, {})
        layer.add_entry(LoRAFactors(f"a{index}", state.entry_for("attention", (ModuleAlpha(alpha, rank),), A.device), A, B))
        deltas.append(alpha * strength / rank * (x @ A.T @ B.T))
    with torch.no_grad():
        torch.testing.assert_close(layer(x), linear(x) + deltas[0] + deltas[1], rtol=1e-5, atol=1e-6)


def test_group_strengths_multiply_and_zero_removes_a_group(tiny_setup):
    shapes, inputs = tiny_setup
    targets = block_targets(shapes)
    no_attention = [t for t in targets if ".attn." not in t or t.startswith("token_refiner.")]
    full = make_adapter(shapes, targets, rank=4, alpha=4.0)
    partial = make_adapter(shapes, targets, rank=4, alpha=4.0)
    partial = type(partial)(info=partial.info, modules={t: partial.modules[t] for t in no_attention}, identity="p")
    model = build_tiny()
    engine = LoRAEngine(model)
    engine.attach(full, _settings(group_strengths={"attention": 0.0}), "a")
    without_attention = forward(model, inputs)
    engine.detach()
    engine.attach(partial, _settings(), "p")
    assert same_bits(forward(model, inputs), without_attention)
    engine.detach()
    engine.attach(full, _settings(strength=0.5, group_strengths={"feed_forward": 2.0}), "a")
    scales = engine.effective_scales("a")
    assert scales["transformer_blocks.0.ff.net.2"] == 4.0 * 0.5 * 2.0 / 4
    assert scales["transformer_blocks.0.attn.to_q"] == 4.0 * 0.5 / 4
    assert scales["token_refiner.refiner_blocks.0.ff.net.2"] == 4.0 * 0.5 / 4  # refiner is its own group
    with pytest.raises(H3AppError, match="unknown group 'mlp'"):
        engine.set_lora("a", group_strengths={"mlp": 1.0})


def test_negative_strength_flips_the_delta():
    torch.manual_seed(1)
    linear = torch.nn.Linear(6, 5).requires_grad_(False)
    A, B = torch.randn(2, 6), torch.randn(5, 2)
    state = AdapterScale((), 4.0, 1.0, {})
    layer = LoRALinear(linear)
    layer.add_entry(LoRAFactors("a", state.entry_for("attention", (ModuleAlpha(4.0, 2),), A.device), A, B))
    x = torch.randn(4, 6)
    with torch.no_grad():
        plus = layer(x) - linear(x)
        state.update(4.0, -1.0, {})
        minus = layer(x) - linear(x)
    torch.testing.assert_close(minus, -plus, rtol=1e-5, atol=1e-6)
    assert float(plus.abs().max()) > 0.1


def test_negative_strength_on_the_model(tiny_setup):
    shapes, inputs = tiny_setup
    model = build_tiny()
    base = forward(model, inputs)
    engine = LoRAEngine(model)
    engine.attach(_adapter(shapes, 4, alpha=4.0), _settings(strength=-0.5), "slider")
    assert engine.effective_scales("slider")["proj_in"] == -0.5
    negative = forward(model, inputs)
    engine.set_lora("slider", strength=0.5)
    assert not same_bits(negative, base) and not same_bits(negative, forward(model, inputs))


def test_rslora_and_per_module_alphas(tiny_setup):
    shapes, inputs = tiny_setup
    targets = block_targets(shapes)
    alphas = {t: (16.0 if ".attn." in t else 4.0) for t in targets}
    model = build_tiny()
    engine = LoRAEngine(model)
    engine.attach(make_adapter(shapes, targets, rank=4, alpha=alphas, alpha_source="adapter_config"), _settings(), "pat")
    scales = engine.effective_scales("pat")
    assert scales["transformer_blocks.0.attn.to_q"] == 16.0 / 4 and scales["transformer_blocks.0.ff.net.2"] == 4.0 / 4
    engine.set_lora("pat", alpha=8)  # an explicit alpha applies to every module
    assert set(engine.effective_scales("pat").values()) == {8.0 / 4}
    engine.detach()
    engine.attach(make_adapter(shapes, targets, rank=16, alpha=8.0, use_rslora=True), _settings(strength=0.5), "rs")
    assert engine.effective_scales("rs")["transformer_blocks.0.attn.to_q"] == 8.0 * 0.5 / math.sqrt(16)
    engine.set_lora("rs", alpha=32)  # stays rsLoRA
    assert engine.effective_scales("rs")["transformer_blocks.0.attn.to_q"] == 32 * 0.5 / 4.0


def test_bf16_layer_computes_the_delta_in_fp32_and_rounds_once():
    torch.manual_seed(2)
    linear = torch.nn.Linear(16, 12, bias=False).to(torch.bfloat16).requires_grad_(False)
    A, B = torch.randn(4, 16), torch.randn(12, 4)
    state = AdapterScale((), 1.0, 0.3, {})
    layer = LoRALinear(linear)
    layer.add_entry(LoRAFactors("a", state.entry_for("attention", (ModuleAlpha(1.0, 4),), A.device), A, B))
    x = torch.randn(5, 16).to(torch.bfloat16)
    with torch.no_grad():
        got = layer(x)
        want = (linear(x).float() + (x.float() @ A.T * (0.3 / 4)) @ B.T).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want)


def test_bad_calls_are_h3app_errors(tiny_setup):
    shapes, _ = tiny_setup
    model = build_tiny()
    engine = LoRAEngine(model)
    adapter = _adapter(shapes, 4, alpha=4.0)
    engine.attach(adapter, _settings(), "a")
    with pytest.raises(H3AppError, match="already attached"):
        engine.attach(adapter, _settings(), "a")
    with pytest.raises(H3AppError, match="no adapter named 'b'"):
        engine.set_lora("b", strength=1.0)
    with pytest.raises(H3AppError, match="alpha must be a finite number > 0"):
        engine.set_lora("a", alpha=-1.0)
    with pytest.raises(H3AppError, match="mode must be one of"):
        engine.set_mode("fused")
    with pytest.raises(H3AppError, match="no adapter named 'zzz'"):
        engine.detach("zzz")
    assert engine.active()["a"].strength == 1.0


def test_attach_with_another_mode_switches_the_engine(tiny_setup):
    shapes, inputs = tiny_setup
    model = build_tiny()
    engine = LoRAEngine(model)
    engine.attach(_adapter(shapes, 4, alpha=4.0), _settings(), "a")
    unmerged = forward(model, inputs)
    engine.attach(_adapter(shapes, 4, alpha=4.0, seed=5), _settings(strength=0.0, mode="merged"), "b")
    assert engine.mode == "merged" and {s.mode for s in engine.active().values()} == {"merged"}
    assert max_rel_err(forward(model, inputs), unmerged) < 1e-5


def test_chunked_inference_forward_equals_the_whole_sequence_forward(monkeypatch):
    from h3app.lora import layers
    torch.manual_seed(3)
    linear = torch.nn.Linear(6, 5).requires_grad_(False)
    layer = LoRALinear(linear)
    state = AdapterScale((), 2.0, 1.5, {})
    entry = state.entry_for("attention", (ModuleAlpha(2.0, 3),), torch.device("cpu"))
    for name in ("a", "b"):
        layer.add_entry(LoRAFactors(name, entry, torch.randn(3, 6), torch.randn(5, 3)))
    x = torch.randn(2, 7, 6)
    with torch.enable_grad():
        whole = layer(x).detach()  # the autograd path computes the whole sequence at once
    monkeypatch.setattr(layers, "FORWARD_CHUNK_BYTES", 4 * 6 * 3)  # 3 rows per chunk: 5 chunks over 14 rows
    with torch.no_grad():
        chunked = layer(x)
    assert chunked.shape == (2, 7, 5)
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-6)
