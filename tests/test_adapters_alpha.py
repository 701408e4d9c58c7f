"""h3app.adapters.alpha: the alpha chain per module, every tier with its provenance, conflicts and fallbacks."""

from __future__ import annotations

import json
import math

import pytest
import torch
from adapter_fixtures import TINY_SHAPES, diffusers_targets, header_view, kohya_block, native_block

from h3app.adapters.alpha import get_pattern_key
from h3app.adapters.inspect import inspect_header
from h3app.errors import H3AppError

OUT = "transformer_blocks.0.attn.to_out.0"
Q = "transformer_blocks.0.attn.to_q"
FF2 = "transformer_blocks.0.ff.net.2"


def _native_with_alpha(alpha: float | None, module: str = "blocks.0.attn.out_proj") -> dict:
    tensors = native_block("", 0, rank=4)
    if alpha is not None:
        tensors[f"{module}.alpha"] = torch.tensor(alpha)
    return tensors


def _lam(**fields) -> dict[str, str]:
    """diffusers' lora_adapter_metadata with transformer.-prefixed fields."""
    return {"lora_adapter_metadata": json.dumps({f"transformer.{k}": v for k, v in fields.items()})}


def test_module_tensor_tier_is_per_module() -> None:
    info = inspect_header(header_view(_native_with_alpha(2.0)), shapes=TINY_SHAPES)
    assert info.alphas[OUT] == 2.0 and info.alpha_sources[OUT] == "module_tensor"
    assert info.alphas[Q] == 4.0 and info.alpha_sources[Q] == "rank_fallback"
    assert info.alpha is None and info.alpha_source == "mixed"


def test_fused_qkv_alpha_applies_to_all_three_targets() -> None:
    info = inspect_header(header_view(_native_with_alpha(1.0, "blocks.0.attn.qkv_proj")), shapes=TINY_SHAPES)
    for projection in ("to_q", "to_k", "to_v"):
        assert info.alphas[f"transformer_blocks.0.attn.{projection}"] == 1.0


def test_fractional_alphas_stay_exact() -> None:
    info = inspect_header(header_view(_native_with_alpha(0.3)), shapes=TINY_SHAPES)
    assert info.alphas[OUT] == float(torch.tensor(0.3, dtype=torch.float32).item())  # the stored value, not 0
    view = header_view(diffusers_targets("transformer."), metadata=_lam(lora_alpha=1.25, r=4))
    assert inspect_header(view).alphas[Q] == 1.25
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 2.5}
    assert inspect_header(header_view(diffusers_targets("base_model.model."), adapter_config=config)).alphas[Q] == 2.5


def test_adapter_config_with_patterns_matched_as_peft_does() -> None:
    config = {"r": 4, "lora_alpha": 8, "alpha_pattern": {"ff.net.2": 2, "^transformer_blocks.1.attn.to_q": 3}}
    info = inspect_header(header_view(diffusers_targets("base_model.model."), adapter_config=config))
    assert info.alphas[FF2] == 2 and info.alphas["token_refiner.refiner_blocks.1.ff.net.2"] == 2
    assert info.alphas["transformer_blocks.1.attn.to_q"] == 3
    assert info.alphas[Q] == 8 and info.alphas["proj_in"] == 8
    assert set(info.alpha_sources.values()) == {"adapter_config"} and info.alpha_source == "adapter_config"


def test_rank_pattern_that_disagrees_with_the_tensors_is_reported() -> None:
    config = {"r": 8, "lora_alpha": 8}
    info = inspect_header(header_view(diffusers_targets("base_model.model.", rank=4), adapter_config=config))
    assert any("adapter_config.json says r=8" in w and "rank 4" in w for w in info.warnings)


def test_diffusers_metadata_tier_uses_the_partition_prefix() -> None:
    metadata = _lam(r=4, lora_alpha=2, alpha_pattern={"^norm_out.linear": 1})
    info = inspect_header(header_view(diffusers_targets("transformer."), metadata=metadata))
    assert info.alphas[Q] == 2 and info.alphas["norm_out.linear"] == 1
    assert info.alpha_sources[Q] == "metadata"


@pytest.mark.parametrize("field", ["alpha", "lora_alpha", "network_alpha"])
def test_plain_metadata_alpha_entries(field: str) -> None:
    info = inspect_header(header_view(diffusers_targets("", slot="default"), metadata={field: "8"}))
    assert info.alpha == 8.0 and info.alpha_source == "metadata"


def test_registry_tier_for_lightx2v_v0_1() -> None:
    view = header_view(diffusers_targets("", slot="default", rank=4), name="minimax_h3_fl2v_turbo_4step_v0.1.safetensors")
    info = inspect_header(view, repo_id="lightx2v/Minimax-h3-Turbo")
    assert info.alpha == 8.0 and info.alpha_source == "registry"
    assert not any("alpha = rank" in w for w in info.warnings)
    assert info.known is not None and info.known["steps"] == 5 and info.known["workflow"] == "fl2va"


def test_registry_alpha_equals_rank_for_larry_has_no_fallback_warning() -> None:
    tensors = native_block("", 0, rank=4) | native_block("", 1, rank=2, modules=("adaln_proj.linear",))
    view = header_view(tensors, name="minimax_h3_turbo_4step_ema_ckpt500.safetensors")
    info = inspect_header(view, repo_id="larryvrh/MiniMax-H3-Turbo-Lora")
    assert info.alphas[Q] == 4.0 and info.alphas["transformer_blocks.1.adaln_proj.linear"] == 2.0
    assert info.alpha_source == "registry"
    assert not any("no alpha" in w for w in info.warnings)


def test_rank_fallback_warns_with_the_scale_of_the_risk() -> None:
    info = inspect_header(header_view(diffusers_targets("", slot="default", rank=32)))
    assert info.alpha == 32.0 and info.alpha_source == "rank_fallback"
    (warning,) = [w for w in info.warnings if "no alpha" in w]
    assert "alpha = rank" in warning
    assert "rank-32 modules trained at alpha 16: 2×, trained at alpha 1: 32× too strong" in warning
    assert "LightX2V" not in warning  # its rank-128 case is named only for rank-128 files (issue 22, item 9)
    rank_128 = inspect_header(header_view(diffusers_targets("", slot="default", rank=128)))
    (warning,) = [w for w in rank_128.warnings if "no alpha" in w]
    assert "LightX2V's rank-128 Turbo expects alpha 8: at alpha = rank it is 16× too strong" in warning


def test_tier_order_and_conflict_warnings_name_both_values() -> None:
    """module tensor > adapter_config > metadata > registry, per module; each conflict names both values."""
    tensors = diffusers_targets("base_model.model.", targets=(Q, OUT), rank=4)
    tensors[f"base_model.model.{Q}.alpha"] = torch.tensor(1.0)
    config = {"r": 4, "lora_alpha": 2}
    metadata = {"alpha": "3"}
    view = header_view(tensors, metadata=metadata, adapter_config=config, name="minimax_h3_fl2v_turbo_4step_v0.1.safetensors")
    info = inspect_header(view, repo_id="lightx2v/Minimax-h3-Turbo")
    assert (info.alphas[Q], info.alpha_sources[Q]) == (1.0, "module_tensor")
    assert (info.alphas[OUT], info.alpha_sources[OUT]) == (2.0, "adapter_config")
    warnings = " | ".join(info.warnings)
    assert "alpha 1 from the module's .alpha tensor wins over alpha 2 from adapter_config.json" in warnings
    assert "alpha 2 from adapter_config.json wins over alpha 3 from the file's metadata" in warnings
    assert "alpha 2 from adapter_config.json wins over alpha 8 from the known-adapter registry" in warnings

    without_config = header_view(diffusers_targets("", targets=(Q,)), metadata={"alpha": "3"},
                                 name="minimax_h3_fl2v_turbo_4step_v0.1.safetensors")
    info = inspect_header(without_config, repo_id="lightx2v/Minimax-h3-Turbo")
    assert (info.alpha, info.alpha_source) == (3.0, "metadata")
    assert any("alpha 3 from the file's metadata wins over alpha 8 from the known-adapter registry" in w for w in info.warnings)


def test_explicit_alpha_wins_and_keeps_rslora() -> None:
    config = {"r": 4, "lora_alpha": 4, "use_rslora": True}
    view = header_view(diffusers_targets("base_model.model."), adapter_config=config)
    plain = inspect_header(view)
    assert plain.use_rslora and plain.alpha == 4
    explicit = inspect_header(view, explicit_alpha=6.5)
    assert explicit.alpha == 6.5 and explicit.alpha_source == "explicit" and explicit.use_rslora
    assert any("alpha 6.5 from the explicit setting wins over alpha 4 from adapter_config.json" in w for w in explicit.warnings)


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True])
def test_invalid_explicit_alpha_is_refused(bad) -> None:
    with pytest.raises(H3AppError, match="alpha must be"):
        inspect_header(header_view(native_block("", 0)), explicit_alpha=bad)


def test_stored_alpha_zero_means_rank_with_a_warning() -> None:
    info = inspect_header(header_view(_native_with_alpha(0.0)))
    assert info.alphas[OUT] == 4.0 and info.alpha_sources[OUT] == "module_tensor"
    assert any("store alpha 0" in w and "kohya's convention" in w for w in info.warnings)


@pytest.mark.parametrize("bad", [-4.0, math.nan, math.inf])
def test_negative_or_non_finite_stored_alpha_is_refused(bad: float) -> None:
    with pytest.raises(H3AppError, match="stores alpha"):
        inspect_header(header_view(_native_with_alpha(bad)))


def test_rslora_from_metadata_and_conflicting_flags() -> None:
    view = header_view(diffusers_targets("transformer."), metadata=_lam(r=4, lora_alpha=4, use_rslora=True))
    assert inspect_header(view).use_rslora
    both = header_view(diffusers_targets("transformer."), metadata=_lam(r=4, lora_alpha=4, use_rslora=True),
                       adapter_config={"r": 4, "lora_alpha": 4, "use_rslora": False})
    info = inspect_header(both)
    assert not info.use_rslora
    assert any("use_rslora is False in adapter_config.json but True in the file's lora_adapter_metadata" in w for w in info.warnings)


def test_ss_network_alpha_is_a_hint_never_applied() -> None:
    info = inspect_header(header_view(kohya_block(0, rank=4), metadata={"ss_network_alpha": "1", "ss_network_dim": "4"}))
    assert info.format == "kohya"
    assert info.alpha == 4.0 and info.alpha_source == "rank_fallback"
    assert info.hints["ss_network_alpha"] == 1.0
    with_tensors = inspect_header(header_view(kohya_block(0, rank=4, alpha=2.0), metadata={"ss_network_alpha": "1"}))
    assert with_tensors.alpha == 2.0 and with_tensors.alpha_source == "module_tensor"


def test_unusable_metadata_is_ignored_with_a_warning() -> None:
    info = inspect_header(header_view(native_block("", 0), metadata={"alpha": "eight", "lora_adapter_metadata": "{oops"}))
    assert info.alpha_source == "rank_fallback"
    assert any("metadata alpha is 'eight', not a number" in w for w in info.warnings)
    assert any("lora_adapter_metadata is not valid JSON" in w for w in info.warnings)


def test_non_lora_adapter_config_is_refused() -> None:
    with pytest.raises(H3AppError, match="for a LOHA adapter"):
        inspect_header(header_view(diffusers_targets("base_model.model."), adapter_config={"peft_type": "LOHA"}))
    with pytest.raises(H3AppError, match="use_dora"):
        inspect_header(header_view(diffusers_targets("base_model.model."), adapter_config={"lora_alpha": 4, "use_dora": True}))


@pytest.mark.parametrize(
    "patterns, key",
    [
        (["ff.net.2"], "transformer_blocks.0.ff.net.2"),
        (["^transformer_blocks.1.attn.to_q"], "transformer_blocks.1.attn.to_q"),
        (["^transformer_blocks.1.attn.to_q"], "token_refiner.refiner_blocks.1.attn.to_q"),
        (["to_q"], "transformer_blocks.0.attn.to_qkv"),
        (["attn.to_q", "to_q"], "transformer_blocks.0.attn.to_q"),
        ([r"transformer_blocks\.\d+\.attn\.to_(q|k)"], "transformer_blocks.12.attn.to_k"),
        (["proj_in"], "audio_proj_in"),
        (["proj_in"], "proj_in"),
        (["blocks.0.ff"], "transformer_blocks.0.ff"),
        ([], "proj_out"),
    ],
)
def test_get_pattern_key_is_peft_s_rule(patterns: list[str], key: str) -> None:
    from peft.utils.other import get_pattern_key as peft_get_pattern_key

    assert get_pattern_key(patterns, key) == peft_get_pattern_key(patterns, key)
