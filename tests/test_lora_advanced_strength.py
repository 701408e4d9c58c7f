"""Advanced strength on the LoRA engine: per-modality factors (exact per token row and per AdaLN modality block),
strength schedules refilled per evaluation, per-block factors; merged mode refuses; A and B stay bit-identical."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from lora_fixtures import build_tiny, forward, linear_shapes, make_adapter, same_bits

from h3app.backend.transformer_check import packed_check_input, run_transformer_check
from h3app.errors import H3AppError
from h3app.lora import LoRAEngine, LoRALinear, compute_lora_delta
from h3app.lora.evaluations import EvaluationListener, RunSchedule, StepListeners, evaluation_events
from h3app.rules.check_pair import CheckSetting
from h3app.rules.modality import AUDIO, MODALITY_BLOCKS, PACKED, TEXT, VIDEO, rows_of
from h3app.rules.scale import effective_scale
from h3app.rules.schedule import parse_schedule
from h3app.settings import LoRASettings

TAG = {VIDEO: 0, TEXT: 1, AUDIO: 2}


# ------------------------------------------------------------------------------------------- the delta itself
def test_row_scaled_delta_equals_a_hand_computed_reference():
    g = torch.Generator().manual_seed(0)
    x, A, B = torch.randn(2, 5, 6, generator=g), torch.randn(3, 6, generator=g), torch.randn(4, 3, generator=g)
    scale = torch.tensor(0.37)
    rows = torch.tensor([[0.0, 1.0, 0.25, -2.0, 1.0], [1.0, 0.0, 3.0, 1.0, 0.5]])
    got = compute_lora_delta(x, A, B, scale=scale, row_scales=rows)
    want = ((x.double() @ A.double().T) * (0.37 * rows.double())[..., None]) @ B.double().T
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    plain = compute_lora_delta(x, A, B, scale=scale)
    assert torch.equal(got[rows == 0], torch.zeros_like(got[rows == 0]))  # a row at 0: exactly no delta
    assert torch.equal(got[rows == 1], plain[rows == 1])  # a row at 1: bitwise the plain delta


def test_row_scales_on_a_stacked_qkv_delta_and_out_blocks_on_an_adaln_delta():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 4, 6, generator=g)
    A, B = torch.randn(3, 2, 6, generator=g), torch.randn(3, 5, 2, generator=g)
    rows = torch.tensor([[1.0, 0.0, 0.5, 2.0]])
    got = compute_lora_delta(x, A, B, group_scales=torch.tensor([1.0, 0.5, 2.0]), scale=torch.tensor(0.3),
                             row_scales=rows)
    parts = [(x.double() @ A[i].double().T) * s * 0.3 * rows.double()[..., None] @ B[i].double().T
             for i, s in enumerate((1.0, 0.5, 2.0))]
    torch.testing.assert_close(got.double(), torch.cat(parts, -1), rtol=1e-6, atol=1e-6)

    A2, B2 = torch.randn(2, 6, generator=g), torch.randn(3 * 4, 2, generator=g)  # three modality blocks of 4
    blocks = torch.tensor([1.0, 0.5, 0.0])
    got = compute_lora_delta(x, A2, B2, scale=torch.tensor(0.3), out_block_scales=blocks)
    plain = compute_lora_delta(x, A2, B2, scale=torch.tensor(0.3))
    want = (plain.double().unflatten(-1, (3, 4)) * blocks.double()[:, None]).flatten(-2)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-7)
    assert torch.equal(got[..., :4], plain[..., :4]) and torch.equal(got[..., 8:], torch.zeros_like(got[..., 8:]))


def test_rows_of_each_target():
    assert rows_of("transformer_blocks.3.attn.to_q") == PACKED and rows_of("proj_out") == PACKED
    assert rows_of("transformer_blocks.3.adaln_proj.linear") == MODALITY_BLOCKS
    assert rows_of("proj_in") == VIDEO and rows_of("audio_proj_in") == AUDIO
    assert rows_of("context_embedder") == TEXT and rows_of("token_refiner.refiner_blocks.0.ff.net.2") == TEXT


# --------------------------------------------------------------------------------------------- on the model
@pytest.fixture(scope="module")
def tiny():
    model = build_tiny()
    shapes = linear_shapes(model)
    targets = [t for t in shapes if not t.startswith("time_embedder.")]
    adapter = make_adapter(shapes, targets, rank=4, alpha=8, seed=5)
    return model, adapter, packed_check_input(model.config, seed=0)


def layer_io(model: torch.nn.Module):
    """Record (input, output, base output) of every LoRA-wrapped Linear during one forward."""
    seen: dict[str, tuple] = {}
    handles = [module.register_forward_hook(
        lambda m, args, out, name=name: seen.__setitem__(name, (args[0], out.clone(), m.base(args[0]))))
        for name, module in model.named_modules() if isinstance(module, LoRALinear)]
    return seen, handles


def test_audio_zero_leaves_every_audio_row_as_the_base_computes_it(tiny):
    model, adapter, inputs = tiny
    engine = LoRAEngine(model)
    engine.attach(adapter, LoRASettings(source="s", audio_strength=0.0, video_strength=0.5), "a")
    seen, handles = layer_io(model)
    try:
        forward(model, inputs)
    finally:
        for handle in handles:
            handle.remove()
        engine.detach()
    tags = inputs["token_tags"]
    checked = {PACKED: 0, MODALITY_BLOCKS: 0, AUDIO: 0, VIDEO: 0}
    for name, (_, out, base) in seen.items():
        kind = rows_of(name)
        if kind == PACKED:
            audio = tags == TAG[AUDIO]
            assert torch.equal(out[:, audio], base[:, audio]), name  # bitwise the base on every audio row
            assert not torch.equal(out[:, ~audio], base[:, ~audio]), name
        elif kind == MODALITY_BLOCKS:
            blocks_out, blocks_base = out.unflatten(-1, (3, -1)), base.unflatten(-1, (3, -1))
            assert torch.equal(blocks_out[..., 2, :], blocks_base[..., 2, :]), name  # the audio block
            assert not torch.equal(blocks_out[..., 0, :], blocks_base[..., 0, :]), name
        elif kind == AUDIO:
            assert torch.equal(out, base), name
        elif kind == VIDEO:
            assert not torch.equal(out, base), name
        checked[kind] = checked.get(kind, 0) + 1
    assert all(checked[kind] for kind in (PACKED, MODALITY_BLOCKS, AUDIO, VIDEO)), checked


def test_a_modality_factor_scales_that_modality_rows_delta(tiny):
    model, adapter, inputs = tiny
    engine = LoRAEngine(model)
    engine.attach(adapter, LoRASettings(source="s"), "a")
    seen_full, handles = layer_io(model)
    forward(model, inputs)
    for handle in handles:
        handle.remove()
    name = "transformer_blocks.0.attn.to_q"
    x, out_full, base = seen_full[name]
    engine.set_lora("a", advanced=LoRASettings(source="s", text_strength=0.25))
    forward(model, inputs)  # the tags of this sequence
    layer = model.get_submodule(name)
    with torch.no_grad():
        out = layer(x)
    engine.detach()
    text = inputs["token_tags"] == TAG[TEXT]
    torch.testing.assert_close(out[:, text] - base[:, text], 0.25 * (out_full[:, text] - base[:, text]),
                               rtol=1e-5, atol=1e-6)
    assert torch.equal(out[:, ~text], out_full[:, ~text])  # rows at factor 1: bitwise the full-strength result


def test_per_block_strength_multiplies_the_group_strengths_and_shows_in_the_profile(tiny):
    model, adapter, _ = tiny
    engine = LoRAEngine(model)
    settings = LoRASettings(source="s", group_strengths={"attention": 0.5}, block_strength="1:3")
    engine.attach(adapter, settings, "a")
    try:
        scales = engine.effective_scales("a")
        for target in adapter.modules:
            block = 3.0 if target.startswith("transformer_blocks.1.") else 1.0
            group = 0.5 if ".attn." in target and target.startswith("transformer_blocks.") else 1.0
            assert scales[target] == effective_scale(8, 1.0, 4, False, group, block), target
        profile = engine.report("a").profile
        ratio = profile.per_block["transformer_blocks.1"].median / profile.per_block["transformer_blocks.0"].median
        engine.set_lora("a", advanced=dataclasses.replace(settings, block_strength=""))
        plain = engine.report("a").profile
        plain_ratio = plain.per_block["transformer_blocks.1"].median / plain.per_block["transformer_blocks.0"].median
        assert ratio == pytest.approx(3.0 * plain_ratio, rel=1e-9)
        with pytest.raises(H3AppError, match="names block 7, but this model has 2 blocks"):
            engine.set_lora("a", advanced=LoRASettings(source="s", block_strength="5-7:0.5"))
    finally:
        engine.detach()


class _Scales(EvaluationListener):
    """Reads one layer's applied scale at each evaluation (registered after the engine's listeners)."""

    def __init__(self, layer: LoRALinear) -> None:
        self.layer, self.seen = layer, []

    def before_evaluation(self, evaluation) -> None:
        self.seen.append(float(self.layer.lora_entries[0].scale.applied))


def test_a_schedule_refills_the_scales_per_evaluation_by_the_formula(tiny):
    model, adapter, inputs = tiny
    engine = LoRAEngine(model)
    engine.attach(adapter, LoRASettings(source="s", strength=0.75, block_strength="0:2",
                                        strength_schedule="linear:1:0.2@0.25-1"), "a")
    layer = model.get_submodule("transformer_blocks.0.ff.net.2")
    probe = _Scales(layer)
    schedule = RunSchedule.of(6, 12.0, 3.0)  # 5 evaluations
    try:
        with evaluation_events(model, schedule, (probe,)):
            for _ in range(schedule.count):
                forward(model, inputs)
        after = float(layer.lora_entries[0].scale.applied)
        with pytest.raises(H3AppError, match="has 2 values but this run has 5 evaluations"):
            engine.set_lora("a", advanced=LoRASettings(source="s", block_strength="0:2", strength_schedule="1,0.5"))
            with evaluation_events(model, schedule):
                pass
    finally:
        engine.detach()
    factors = parse_schedule("linear:1:0.2@0.25-1").per_evaluation(5)  # p = 0, .25, .5, .75, 1
    assert factors == pytest.approx([0.0, 1.0, 1.0 - 0.8 / 3, 1.0 - 1.6 / 3, 0.2], abs=1e-15)
    want = [float(torch.tensor(effective_scale(8, 0.75, 4, False, 1.0, 2.0, f), dtype=torch.float64).float())
            for f in factors]
    assert probe.seen == pytest.approx(want, rel=0, abs=0)
    assert after == float(torch.tensor(effective_scale(8, 0.75, 4, False, 1.0, 2.0), dtype=torch.float64).float())


def test_merged_mode_refuses_modality_factors_and_schedules(tiny):
    model, adapter, _ = tiny
    with pytest.raises(H3AppError, match="per-modality strength .*needs --lora-mode unmerged"):
        LoRASettings(source="s", mode="merged", audio_strength=0)
    with pytest.raises(H3AppError, match="strength schedule .*needs --lora-mode unmerged"):
        LoRASettings(source="s", mode="merged", strength_schedule="1,0.5")
    engine = LoRAEngine(model)
    engine.attach(adapter, LoRASettings(source="s", mode="merged", block_strength="0:0.5"), "a")  # blocks bake
    try:
        before = engine.active()["a"]
        with pytest.raises(H3AppError, match="merged mode bakes one strength"):
            engine.set_lora("a", advanced=LoRASettings(source="s", video_strength=0.5))
        assert engine.active()["a"] == before
        engine.set_mode("unmerged")
        engine.set_lora("a", advanced=LoRASettings(source="s", strength_schedule="constant:0.5"))
        with pytest.raises(H3AppError, match="adapter 'a': merged mode bakes .* strength schedule"):
            engine.set_mode("merged")
        assert engine.mode == "unmerged"
    finally:
        engine.detach()


def test_a_and_b_stay_bit_identical_with_every_factor(tiny):
    model, adapter, inputs = tiny
    advanced = dict(video_strength=0.7, text_strength=1.3, audio_strength=0.2, block_strength="0:0.5,1:1.5",
                    strength_schedule="1,0.5,0.25")
    engine = LoRAEngine(model)
    schedule = RunSchedule.of(4, 12.0, 3.0)

    def run() -> list[tuple[torch.Tensor, torch.Tensor]]:
        with evaluation_events(model, schedule):
            return [forward(model, inputs) for _ in range(schedule.count)]

    engine.attach(adapter, LoRASettings(source="s", alpha=8, strength=1.0, **advanced), "a")
    try:
        out_a = run()
        engine.set_lora("a", alpha=128, strength=0.0625)
        out_b = run()
        engine.set_lora("a", advanced=LoRASettings(source="s"))
        plain = run()
    finally:
        engine.detach()
    assert all(same_bits(a, b) for a, b in zip(out_a, out_b))
    assert not any(same_bits(a, p) for a, p in zip(out_a, plain))  # the factors did change the run


def test_transformer_check_is_identical_with_modality_and_block_factors(tiny):
    model, adapter, _ = tiny
    settings = LoRASettings(source="s", audio_strength=0.0, video_strength=0.6, block_strength="1:2",
                            strength_schedule="1,0.5")
    result = run_transformer_check(model, adapter, a=CheckSetting(8.0, 1.0), b=CheckSetting(128.0, 0.0625),
                                   advanced=settings)
    assert result["identical"] and result["control_identical"]
    assert any("schedule" in warning for warning in result["warnings"])
    plain = run_transformer_check(model, adapter, a=CheckSetting(8.0, 1.0), b=CheckSetting(128.0, 0.0625))
    assert result["hash_a"] != plain["hash_a"]


def test_a_schedule_moves_exact_deltas_per_evaluation_and_puts_them_back(tmp_path):
    from adapter_fixtures import TINY_SHAPES, save
    from extra_parts_fixtures import FASTH3_METADATA, apply_by_hand, fasth3_tensors
    from lora_fixtures import max_rel_err, state_hash

    from h3app.adapters.normalise import load_adapter

    tensors = fasth3_tensors()
    adapter = load_adapter(save(tmp_path / "fasth3.safetensors", tensors, FASTH3_METADATA), shapes=TINY_SHAPES)
    model = build_tiny()
    base = state_hash(model)
    inputs = packed_check_input(model.config, 0)
    engine = LoRAEngine(model)
    engine.attach(adapter, LoRASettings(source="fast", strength=0.5, strength_schedule="1,0.5,0"), "fast")
    attached = state_hash(model)
    schedule = RunSchedule.of(4, 12.0, 3.0)
    with evaluation_events(model, schedule):
        outputs = [forward(model, inputs) for _ in range(schedule.count)]
    assert state_hash(model) == attached  # the deltas are back at strength 0.5 after the run
    engine.detach()
    assert state_hash(model) == base
    for factor, got in zip((1.0, 0.5, 0.0), outputs):
        reference = build_tiny()
        apply_by_hand(reference, tensors, 0.5 * factor)  # pairs and deltas both at strength × factor
        assert max_rel_err(got, forward(reference, inputs)) < 1e-5, factor


def test_step_listeners_belong_to_the_transformer_the_engine_serves(tiny):
    """Registered by name on the engine's transformer at attach, gone at detach; a copy of the transformer carries
    none; another transformer never hears them (no module-wide table)."""
    import copy

    model, adapter, _ = tiny
    other = build_tiny()
    engine = LoRAEngine(model)
    engine.attach(adapter, LoRASettings(source="s", strength_schedule="1,0.5"), "a")
    try:
        registered = StepListeners.registered(model)
        assert engine.step_listeners is StepListeners.on(model)
        assert [type(listener).__name__ for listener in registered] == ["StepStrength"]
        assert registered[0].schedule == parse_schedule("1,0.5")  # parsed at attach, read unparsed by a run
        engine.set_lora("a", advanced=LoRASettings(source="s", strength_schedule="constant:0.5"))
        assert registered[0].schedule == parse_schedule("constant:0.5")
        assert StepListeners.registered(other) == () and StepListeners.registered(copy.deepcopy(model)) == ()
    finally:
        engine.detach()
    assert StepListeners.registered(model) == ()
