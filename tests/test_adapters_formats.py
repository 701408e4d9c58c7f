"""h3app.adapters.formats: every H3 layout and prefix maps onto canonical targets; everything else is refused by name."""

from __future__ import annotations

import pytest
import torch
from adapter_fixtures import (
    TINY_SHAPES,
    diffusers_targets,
    factors,
    header_view,
    lora_keys,
    native_block,
)

from h3app.adapters.formats import (
    BLOCKED,
    FUSED_QKV,
    INTERLEAVED,
    PLAIN,
    SWIGLU_GATE_UP,
    AdapterPlan,
    native_vocabulary,
    plan_adapter,
)
from h3app.errors import H3AppError

BLOCK0_TARGETS = {
    "transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k", "transformer_blocks.0.attn.to_v",
    "transformer_blocks.0.attn.to_out.0", "transformer_blocks.0.ff.net.0.proj", "transformer_blocks.0.ff.net.2",
    "transformer_blocks.0.adaln_proj.linear",
}


def targets(plan: AdapterPlan) -> set[str]:
    return {t for m in plan.modules for t in m.targets}


def assert_every_key_lands_once(tensors: dict, plan: AdapterPlan) -> None:
    """Each key is in exactly one place: a module (applied or reference) or the unmatched list."""
    placed = [k for m in plan.modules + plan.reference_modules for k in m.keys] + list(plan.unmatched_keys)
    assert sorted(placed) == sorted(tensors)


def refusal(tensors: dict, **kwargs) -> str:
    with pytest.raises(H3AppError) as caught:
        plan_adapter(header_view(tensors), **kwargs)
    message = str(caught.value)
    assert "\n" not in message and "adapter.safetensors" in message
    return message


@pytest.mark.parametrize("prefix", ["", "diffusion_model.", "model.diffusion_model.", "transformer."])
@pytest.mark.parametrize("style, expected_style", [("ab", "lora_A/B"), ("du", "lora_down/up")])
def test_native_layout_every_prefix_and_suffix_style(prefix: str, style: str, expected_style: str) -> None:
    tensors = native_block(prefix, 0, style=style) | native_block(prefix, 0, refiner=True, style=style)
    plan = plan_adapter(header_view(tensors))
    assert plan.format == "native"
    assert plan.prefix == prefix
    assert plan.suffix_style == expected_style
    assert targets(plan) == BLOCK0_TARGETS | {
        f"token_refiner.refiner_blocks.0.{s}" for s in ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")
    }
    layouts = {m.module: (m.layout, m.qkv_order) for m in plan.modules}
    assert layouts["blocks.0.attn.qkv_proj"] == (FUSED_QKV, BLOCKED)
    assert layouts["blocks.0.mlp.fc1"] == (SWIGLU_GATE_UP, "")
    assert layouts["blocks.0.attn.out_proj"] == (PLAIN, "")
    assert plan.unmatched_keys == ()
    assert_every_key_lands_once(tensors, plan)


def test_native_global_modules_map_to_diffusers_names() -> None:
    vocabulary = native_vocabulary(TINY_SHAPES)
    expected = {
        "video_patch_proj": "proj_in", "audio_patch_proj": "audio_proj_in", "condition_proj": "context_embedder",
        "time_embedder.proj_in": "time_embedder.linear_1", "time_embedder.proj_out": "time_embedder.linear_2",
        "final_layer.adaln_proj.linear": "norm_out.linear", "final_layer.video_out": "proj_out",
        "final_layer.audio_out": "audio_proj_out",
    }
    tensors = {}
    for seed, name in enumerate(expected):
        tensors.update(lora_keys(f"diffusion_model.{name}", *factors(*vocabulary[name], 2, seed=seed)))
    plan = plan_adapter(header_view(tensors))
    mapping = {m.module: m.targets for m in plan.modules}
    assert mapping == {native: (canonical,) for native, canonical in expected.items()}
    for module in plan.modules:
        linear = TINY_SHAPES[module.targets[0]]
        assert module.target_shapes == ((linear.out_features, linear.in_features),)


def test_diffsynth_is_native_names_with_the_default_slot() -> None:
    tensors = native_block("", 1, slot="default")
    plan = plan_adapter(header_view(tensors))
    assert plan.format == "diffsynth"
    qkv = next(m for m in plan.modules if m.layout == FUSED_QKV)
    assert qkv.qkv_order == INTERLEAVED
    assert qkv.targets == ("transformer_blocks.1.attn.to_q", "transformer_blocks.1.attn.to_k", "transformer_blocks.1.attn.to_v")
    assert_every_key_lands_once(tensors, plan)


def test_qkv_layout_override_for_files_without_a_tell() -> None:
    native = header_view(native_block("", 0))
    diffsynth = header_view(native_block("", 0, slot="default"))
    order = lambda plan: next(m.qkv_order for m in plan.modules if m.layout == FUSED_QKV)  # noqa: E731
    assert order(plan_adapter(native, qkv_layout="interleaved")) == INTERLEAVED
    assert order(plan_adapter(diffsynth, qkv_layout="blocked")) == BLOCKED
    assert order(plan_adapter(native, qkv_layout="auto")) == BLOCKED
    with pytest.raises(H3AppError, match="qkv_layout must be one of"):
        plan_adapter(native, qkv_layout="sideways")


@pytest.mark.parametrize("prefix", ["", "transformer.", "base_model.model.", "base_model.model.transformer."])
@pytest.mark.parametrize("slot", [None, "default"])
def test_peft_layout_every_prefix_with_and_without_slot(prefix: str, slot: str | None) -> None:
    tensors = diffusers_targets(prefix, slot=slot)
    plan = plan_adapter(header_view(tensors))
    assert plan.format == "peft"
    assert plan.prefix == prefix
    assert targets(plan) == set(TINY_SHAPES.linears)
    assert all(m.layout == PLAIN for m in plan.modules)
    assert_every_key_lands_once(tensors, plan)


def test_peft_fused_to_qkv_splits_blocked() -> None:
    down, up = factors(96, 24, 4, seed=5)
    plan = plan_adapter(header_view(lora_keys("transformer.transformer_blocks.1.attn.to_qkv", down, up)))
    (module,) = plan.modules
    assert module.layout == FUSED_QKV and module.qkv_order == BLOCKED
    assert module.targets == ("transformer_blocks.1.attn.to_q", "transformer_blocks.1.attn.to_k", "transformer_blocks.1.attn.to_v")
    assert module.target_shapes == ((32, 24),) * 3


def test_kohya_unflattens_native_and_diffusers_vocabularies() -> None:
    vocabulary = native_vocabulary(TINY_SHAPES)
    tensors = {}
    for seed, name in enumerate(["blocks.1.attn.qkv_proj", "token_refiner.blocks.0.mlp.fc1", "final_layer.audio_out", "time_embedder.proj_out"]):
        stem = "lora_unet_" + name.replace(".", "_")
        tensors.update(lora_keys(stem, *factors(*vocabulary[name], 4, seed=seed), style="du"))
        tensors[f"{stem}.alpha"] = torch.tensor(2.0)
    for seed, target in enumerate(["transformer_blocks.0.attn.to_out.0", "token_refiner.refiner_blocks.1.ff.net.0.proj", "norm_out.linear"]):
        linear = TINY_SHAPES[target]
        stem = "lora_unet_" + target.replace(".", "_")
        tensors.update(lora_keys(stem, *factors(linear.out_features, linear.in_features, 4, seed=10 + seed), style="du"))
    plan = plan_adapter(header_view(tensors))
    assert plan.format == "kohya" and plan.prefix == "lora_unet_" and plan.suffix_style == "lora_down/up"
    modules = {m.module: m for m in plan.modules}
    assert modules["blocks.1.attn.qkv_proj"].layout == FUSED_QKV
    assert modules["token_refiner.blocks.0.mlp.fc1"].targets == ("token_refiner.refiner_blocks.0.ff.net.0.proj",)
    assert modules["token_refiner.blocks.0.mlp.fc1"].layout == SWIGLU_GATE_UP
    assert modules["final_layer.audio_out"].targets == ("audio_proj_out",)
    assert modules["time_embedder.proj_out"].targets == ("time_embedder.linear_2",)
    # diffusers names keep their own layout: ff.net.0.proj is already [up; gate].
    assert modules["token_refiner.refiner_blocks.1.ff.net.0.proj"].layout == PLAIN
    assert modules["transformer_blocks.0.attn.to_out.0"].targets == ("transformer_blocks.0.attn.to_out.0",)
    assert modules["norm_out.linear"].targets == ("norm_out.linear",)
    assert modules["blocks.1.attn.qkv_proj"].alpha_key == "lora_unet_blocks_1_attn_qkv_proj.alpha"
    assert_every_key_lands_once(tensors, plan)


def test_hybrid_flattened_names_are_matched_with_a_warning() -> None:
    vocabulary = native_vocabulary(TINY_SHAPES)
    tensors = lora_keys("blocks.0_adaln_proj_linear", *factors(*vocabulary["blocks.0.adaln_proj.linear"], 2, seed=1), style="du")
    plan = plan_adapter(header_view(tensors))
    assert targets(plan) == {"transformer_blocks.0.adaln_proj.linear"}
    assert any("hybrid flattened names" in w for w in plan.warnings)


def test_unmatched_keys_are_listed_never_dropped() -> None:
    tensors = native_block("", 0)
    tensors.update(lora_keys("blocks.0.attn.q_norm", *factors(16, 16, 2, seed=9)))  # a norm: no LoRA-able Linear
    tensors["blocks.0.attn.out_proj.lora_A.weight.extra"] = torch.zeros(1)
    tensors["blocks.7.mlp.fc2.alpha"] = torch.tensor(4.0)  # an alpha without factors
    plan = plan_adapter(header_view(tensors))
    assert set(plan.unmatched_keys) == {
        "blocks.0.attn.q_norm.lora_A.weight", "blocks.0.attn.q_norm.lora_B.weight",
        "blocks.0.attn.out_proj.lora_A.weight.extra", "blocks.7.mlp.fc2.alpha",
    }
    assert any("3 keys match no H3 module" in w for w in plan.warnings)
    assert any("1 alpha tensors have no LoRA factors" in w for w in plan.warnings)
    assert_every_key_lands_once(tensors, plan)


def test_reference_partition_is_kept_apart_unless_asked_for() -> None:
    tensors = diffusers_targets("transformer.", targets=("transformer_blocks.0.attn.to_q",))
    tensors |= diffusers_targets("transformer_ref.", targets=("transformer_blocks.0.attn.to_k", "transformer_blocks.1.ff.net.2"), seed=3)
    plan = plan_adapter(header_view(tensors))
    assert targets(plan) == {"transformer_blocks.0.attn.to_q"}
    assert {t for m in plan.reference_modules for t in m.targets} == {"transformer_blocks.0.attn.to_k", "transformer_blocks.1.ff.net.2"}
    assert any("for the reference partition (transformer_ref), not applied" in w for w in plan.warnings)
    assert_every_key_lands_once(tensors, plan)

    for_ref = plan_adapter(header_view(tensors), partition="transformer_ref")
    assert targets(for_ref) == {"transformer_blocks.0.attn.to_k", "transformer_blocks.1.ff.net.2"}
    assert set(for_ref.unmatched_keys) == {
        "transformer.transformer_blocks.0.attn.to_q.lora_A.weight", "transformer.transformer_blocks.0.attn.to_q.lora_B.weight",
    }
    assert_every_key_lands_once(tensors, for_ref)
    generic = plan_adapter(header_view(diffusers_targets("transformer.")), partition="transformer_ref")
    assert targets(generic) == set(TINY_SHAPES.linears)


def test_three_dimensional_qkv_stacks() -> None:
    generator = torch.Generator().manual_seed(0)
    stacked = {
        "blocks.0.attn.qkv_proj.lora_A.weight": torch.randn(3, 4, 24, generator=generator),
        "blocks.0.attn.qkv_proj.lora_B.weight": torch.randn(3, 32, 4, generator=generator),
    }
    (module,) = plan_adapter(header_view(stacked)).modules
    assert module.stacked and module.rank == 4 and module.target_shapes == ((32, 24),) * 3

    wrong_groups = dict(stacked, **{"blocks.0.attn.qkv_proj.lora_B.weight": torch.randn(2, 32, 4, generator=generator)})
    assert "stacks 3 lora_A and 2 lora_B groups" in refusal(wrong_groups)
    both_two = {
        "blocks.0.attn.qkv_proj.lora_A.weight": torch.randn(2, 4, 24, generator=generator),
        "blocks.0.attn.qkv_proj.lora_B.weight": torch.randn(2, 32, 4, generator=generator),
    }
    assert "needs exactly 3 of each" in refusal(both_two)
    on_out_proj = {
        "blocks.0.attn.out_proj.lora_A.weight": torch.randn(3, 4, 32, generator=generator),
        "blocks.0.attn.out_proj.lora_B.weight": torch.randn(3, 24, 4, generator=generator),
    }
    assert "only a fused QKV module may have" in refusal(on_out_proj)
    mixed = dict(stacked, **{"blocks.0.attn.qkv_proj.lora_A.weight": torch.randn(4, 24, generator=generator)})
    assert "expected 2D" in refusal(mixed)


@pytest.mark.parametrize(
    "tensors, fragment",
    [
        # LoHa and LoKr load (tests/test_adapters_lycoris.py); incomplete or conv ones cannot
        ({"blocks.0.attn.qkv_proj.hada_w1_a": torch.zeros(96, 2), "blocks.0.attn.qkv_proj.hada_w1_b": torch.zeros(2, 24)}, "no hada_w2_a"),
        ({"lora_unet_blocks_0_attn_qkv_proj.lokr_w1": torch.zeros(4, 4), "lora_unet_blocks_0_attn_qkv_proj.lokr_t2": torch.zeros(2, 2, 3, 3)}, "Tucker cores"),
        ({"base_model.model.transformer_blocks.0.attn.to_q.lora_magnitude_vector": torch.zeros(32),
          "base_model.model.transformer_blocks.0.attn.to_q.lora_A.weight": torch.zeros(2, 24)}, "no lora_B/lora_up"),
        ({"lora_unet_blocks_0_attn_out_proj.dora_scale": torch.zeros(24, 1)}, "holds no LoRA factors"),  # DoRA loads: tests/test_lora_dora.py
        # exact parts (.diff/.diff_b/.set_weight) are applied (tests/test_adapters_extra_parts.py); these cannot be
        ({"diffusion_model.blocks.0.attn.qkv_proj.diff": torch.zeros(96, 24)}, "on the fused projection"),
        ({"transformer_blocks.0.attn.to_gate_compress.set_weight": torch.zeros(2, 24)}, "VSA attention backend"),
        ({"diffusion_model.blocks.0.adaln_proj.diff_m": torch.zeros(24)}, "modulation delta (.diff_m)"),
        ({"transformer.transformer_blocks.0.attn.to_q.lora_B.bias": torch.zeros(32)}, "lora_B.bias"),
        (lora_keys("diffusion_model.blocks.0.self_attn.q", torch.zeros(2, 24), torch.zeros(24, 2)), "made for Wan"),
        (lora_keys("lora_unet_blocks_3_cross_attn_k", torch.zeros(2, 24), torch.zeros(24, 2), "du"), "made for Wan"),
        (lora_keys("transformer.blocks.0.attn1.to_q", torch.zeros(2, 24), torch.zeros(24, 2)), "made for Wan"),
        (lora_keys("lora_unet_double_blocks_0_img_attn_qkv", torch.zeros(2, 24), torch.zeros(72, 2), "du"), "made for Flux"),
        (lora_keys("transformer.single_transformer_blocks.0.attn.to_q", torch.zeros(2, 24), torch.zeros(24, 2)), "made for Flux"),
        (lora_keys("diffusion_model.double_blocks.0.img_attn_qkv", torch.zeros(2, 24), torch.zeros(72, 2)), "made for HunyuanVideo"),
        (lora_keys("transformer.transformer_blocks.0.attn1.to_q", torch.zeros(2, 24), torch.zeros(24, 2)), "made for LTX-Video"),
        ({"blocks.0.attn.qkv_proj.weight": torch.zeros(96, 24), "blocks.0.attn.out_proj.weight": torch.zeros(24, 32),
          "proj_in.bias": torch.zeros(24)}, "model checkpoint, not an adapter"),
        ({"blocks.0.attn.out_proj.lora_A.weight": torch.zeros(2, 32)}, "has lora_A/lora_down but no lora_B/lora_up"),
        ({"blocks.0.attn.out_proj.lora_B.weight": torch.zeros(24, 2)}, "has lora_B/lora_up but no lora_A/lora_down"),
        (lora_keys("blocks.0.attn.out_proj", torch.zeros(4, 32), torch.zeros(24, 2)), "lora_A rank 4 but lora_B rank 2"),
        (lora_keys("blocks.0.attn.qkv_proj", torch.zeros(4, 24), torch.zeros(95, 4)), "95 lora_B rows, not divisible by 3"),
        (lora_keys("blocks.0.mlp.fc1", torch.zeros(4, 24), torch.zeros(63, 4)), "63 lora_B rows, not even"),
        (lora_keys("blocks.0.attn.out_proj", torch.zeros(4, 32, dtype=torch.int8), torch.zeros(24, 4)), "quantised or integer"),
        ({"blocks.0.attn.out_proj.lora_A.weight": torch.zeros(2, 32), "blocks.0.attn.out_proj.lora_up.weight": torch.zeros(24, 2)},
         "mixes lora_A/B and lora_down/up"),
        ({"blocks.0.attn.out_proj.lora_A.weight": torch.zeros(2, 32), "blocks.0.attn.out_proj.lora_down.weight": torch.zeros(2, 32),
          "blocks.0.attn.out_proj.lora_B.weight": torch.zeros(24, 2)}, "both give the down factor"),
        ({**lora_keys("diffusion_model.blocks.0.attn.out_proj", torch.zeros(2, 32), torch.zeros(24, 2)),
          **lora_keys("blocks.0.attn.out_proj", torch.zeros(2, 32), torch.zeros(24, 2))}, "mixes two copies"),
        ({**lora_keys("blocks.0.attn.qkv_proj", torch.zeros(2, 24), torch.zeros(96, 2)),
          **lora_keys("transformer.transformer_blocks.0.attn.to_k", torch.zeros(2, 24), torch.zeros(32, 2))}, "is given twice"),
        ({**lora_keys("transformer_blocks.0.attn.to_q", torch.zeros(2, 24), torch.zeros(32, 2), slot="default"),
          **lora_keys("transformer_blocks.0.attn.to_k", torch.zeros(2, 24), torch.zeros(32, 2), slot="other")}, "several PEFT adapter slots"),
        (lora_keys("something.else.entirely", torch.zeros(2, 4), torch.zeros(4, 2)), "none of its 2 keys names an H3 module"),
        ({"a": torch.zeros(2), "b": torch.zeros(3)}, "holds no LoRA factors"),
    ],
)
def test_refusals_name_what_was_seen(tensors: dict, fragment: str) -> None:
    assert fragment in refusal(tensors)


def test_metadata_architecture_is_named_when_nothing_matches() -> None:
    tensors = lora_keys("lora_unet_some_module", torch.zeros(2, 4), torch.zeros(4, 2), "du")
    with pytest.raises(H3AppError, match="ss_base_model_version = 'qwen_image'"):
        plan_adapter(header_view(tensors, metadata={"ss_base_model_version": "qwen_image"}))


def test_block_indices_sort_numerically_and_dtype_is_reported() -> None:
    tensors = {}
    for index in (10, 2):
        tensors |= lora_keys(f"blocks.{index}.attn.out_proj", *factors(24, 32, 2, seed=index, dtype=torch.bfloat16))
    plan = plan_adapter(header_view(tensors))
    assert [m.module for m in plan.modules] == ["blocks.2.attn.out_proj", "blocks.10.attn.out_proj"]
    assert plan.dtype == "BF16"
