"""h3app.adapters.inspect: the AdapterInfo contract, shape checks against a model, and full-size files read from
their header alone."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from adapter_fixtures import (
    TINY_SHAPES,
    diffusers_targets,
    factors,
    forbid_tensor_loads,
    header_view,
    larry_full_size_entries,
    lightx2v_full_size_entries,
    lora_keys,
    native_block,
    save,
    write_sparse_safetensors,
)

from h3app.adapters.inspect import inspect_file, inspect_header
from h3app.adapters.types import HeaderView
from h3app.errors import H3AppError
from h3app.rules.h3_modules import FULL_SIZE_CONFIG, transformer_shapes

FULL_SHAPES = transformer_shapes(FULL_SIZE_CONFIG)
CONTRACT_FIELDS = {
    "format", "suffix_style", "prefix", "rank", "ranks", "alpha", "alpha_source", "alphas", "alpha_sources",
    "num_targets", "targets", "dtype", "file_bytes", "warnings", "hints", "known",
}


def test_info_follows_the_inspect_json_contract(tmp_path: Path) -> None:
    tensors = native_block("diffusion_model.", 0, rank=4) | native_block("diffusion_model.", 1, rank=4)
    path = save(tmp_path / "native.safetensors", tensors)
    info = inspect_file(path, shapes=TINY_SHAPES)
    payload = info.to_json()
    assert CONTRACT_FIELDS <= set(payload)
    assert payload["format"] == "native" and payload["prefix"] == "diffusion_model." and payload["suffix_style"] == "lora_A/B"
    # Per block: a fused qkv counts 3, plus out, fc1, fc2 and the AdaLN projection.
    assert payload["num_targets"] == 14 == len(payload["targets"])
    assert set(payload["targets"]) <= set(TINY_SHAPES.linears)
    assert payload["rank"] == 4 and set(payload["ranks"].values()) == {4}
    assert payload["alpha"] == 4.0 and payload["alpha_source"] == "rank_fallback"
    assert payload["dtype"] == "F32" and payload["file_bytes"] == path.stat().st_size
    assert payload["known"] is None and payload["unmatched_keys"] == [] and payload["reference_targets"] == []
    assert not any("does not fit" in w for w in payload["warnings"])


def test_without_a_model_the_full_size_shapes_only_warn() -> None:
    info = inspect_header(header_view(native_block("", 0)))
    assert info.num_targets == 7
    (warning,) = [w for w in info.warnings if "does not fit the full-size MiniMax-H3" in w]
    assert "an H3 with hidden size 24" in warning and "check it with --model" in warning


def test_a_full_size_lora_on_the_tiny_model_is_refused_and_named() -> None:
    entries = {k: v for k, v in lightx2v_full_size_entries(rank=4).items() if ".0." in k}
    view = HeaderView(tensors=entries, metadata={}, scalars={}, adapter_config=None, file_bytes=1, name="big.safetensors")
    with pytest.raises(H3AppError) as caught:
        inspect_header(view, shapes=TINY_SHAPES)
    message = str(caught.value)
    assert "big.safetensors does not fit the model in use" in message
    assert "it is a LoRA for the full-size H3, the model in use has hidden size 24" in message
    assert "LoRA 7168×5376 vs model 32×24" in message and "more)" in message


def test_a_pruned_h3_lora_on_the_full_model_is_named() -> None:
    entries = {
        "blocks.0.attn.out_proj.lora_A.weight": ("BF16", (16, 7168)),
        "blocks.0.attn.out_proj.lora_B.weight": ("BF16", (5376, 16)),
        "blocks.0.adaln_proj.linear.lora_A.weight": ("BF16", (16, 1024)),  # pruned AdaLN input width
        "blocks.0.adaln_proj.linear.lora_B.weight": ("BF16", (96768, 16)),
    }
    view = HeaderView(tensors=entries, metadata={}, scalars={}, adapter_config=None, file_bytes=1, name="pruned.safetensors")
    with pytest.raises(H3AppError, match="built for a pruned H3 checkpoint.*--skip-parts adaln"):
        inspect_header(view, shapes=FULL_SHAPES)
    assert any("pruned H3" in w for w in inspect_header(view).warnings)  # without a model: a warning only


def test_targets_beyond_the_model_are_named() -> None:
    vocabulary_shape = (24, 32)
    tensors = lora_keys("blocks.5.attn.out_proj", *factors(*vocabulary_shape, 2, seed=1))
    with pytest.raises(H3AppError, match=r"transformer_blocks.5.attn.to_out.0 \(24×32\) is not in the model"):
        inspect_header(header_view(tensors), shapes=TINY_SHAPES)


def test_reference_only_file_says_nothing_applies() -> None:
    info = inspect_header(header_view(diffusers_targets("transformer_ref.")), shapes=TINY_SHAPES)
    assert info.num_targets == 0 and info.targets == ()
    assert len(info.reference_targets) == len(TINY_SHAPES.linears)
    assert any("nothing in adapter.safetensors applies to the transformer partition" in w for w in info.warnings)
    for_ref = inspect_header(header_view(diffusers_targets("transformer_ref.")), shapes=TINY_SHAPES, partition="transformer_ref")
    assert for_ref.num_targets == len(TINY_SHAPES.linears)


@pytest.mark.slow
def test_full_size_lightx2v_file_inspects_from_its_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entries = lightx2v_full_size_entries(rank=128)
    assert len(entries) == 624
    path = write_sparse_safetensors(tmp_path / "minimax_h3_fl2v_turbo_4step_v0.1.safetensors", entries)
    assert path.stat().st_size > 1_380_000_000
    forbid_tensor_loads(monkeypatch)
    started = time.perf_counter()
    info = inspect_file(path, shapes=FULL_SHAPES, repo_id="lightx2v/Minimax-h3-Turbo")
    seconds = time.perf_counter() - started
    print(f"full-size LightX2V header inspection: {seconds * 1000:.1f} ms")
    assert info.format == "peft" and info.prefix == "" and info.dtype == "BF16"
    assert info.num_targets == 312 and info.rank == 128
    assert info.alpha == 8.0 and info.alpha_source == "registry"
    assert info.known is not None and info.known["steps"] == 5
    for target in info.targets:
        linear = FULL_SHAPES[target]
        assert entries[f"{target}.lora_A.default.weight"][1] == (128, linear.in_features)
        assert entries[f"{target}.lora_B.default.weight"][1] == (linear.out_features, 128)
    assert {t.split(".")[0] for t in info.targets} == {"transformer_blocks", "token_refiner"}


@pytest.mark.slow
def test_full_size_larry_file_with_mixed_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entries = larry_full_size_entries()
    assert len(entries) == 518
    path = write_sparse_safetensors(tmp_path / "minimax_h3_turbo_v4_step600_ema.safetensors", entries)
    forbid_tensor_loads(monkeypatch)
    info = inspect_file(path, shapes=FULL_SHAPES, repo_id="larryvrh/MiniMax-H3-Turbo-Lora")
    assert info.format == "native" and info.rank is None
    assert set(info.ranks.values()) == {64, 16}
    assert info.ranks["transformer_blocks.49.adaln_proj.linear"] == 16 and info.ranks["norm_out.linear"] == 16
    assert info.ranks["transformer_blocks.0.attn.to_q"] == 64
    # 50 blocks × (q, k, v, out, ff0, ff2, adaln) + 2 refiner blocks × 6 + the final AdaLN projection.
    assert info.num_targets == 50 * 7 + 2 * 6 + 1
    assert info.alphas == info.ranks and info.alpha_source == "registry"
    assert info.known is not None and info.known["steps"] == 9
    assert not any("does not fit" in w or "no alpha" in w for w in info.warnings)


def test_alpha_scalars_are_read_from_a_sparse_file(tmp_path: Path) -> None:
    """The LightX2V ComfyUI variant: native names with F32 `.alpha` scalars, read without the factors."""
    entries = {"diffusion_model.blocks.0.attn.qkv_proj.lora_A.weight": ("BF16", (128, 5376)),
               "diffusion_model.blocks.0.attn.qkv_proj.lora_B.weight": ("BF16", (21504, 128))}
    path = write_sparse_safetensors(tmp_path / "comfy.safetensors", entries, scalars={"diffusion_model.blocks.0.attn.qkv_proj.alpha": 8.0})
    info = inspect_file(path, shapes=FULL_SHAPES)
    assert info.alpha == 8.0 and info.alpha_source == "module_tensor" and info.num_targets == 3


def test_inspect_file_matches_the_registry_from_the_hub_cache_path(tmp_path: Path) -> None:
    folder = tmp_path / "hub" / "models--lightx2v--Minimax-h3-Turbo" / "snapshots" / ("b" * 40)
    tensors = diffusers_targets("", slot="default", targets=("transformer_blocks.0.attn.to_q",))
    path = save(folder / "minimax_h3_fl2v_turbo_4step_v0.1.safetensors", tensors)
    info = inspect_file(path, shapes=TINY_SHAPES)
    assert info.alpha == 8.0 and info.alpha_source == "registry"


def test_bf16_factors_dtype(tmp_path: Path) -> None:
    down, up = factors(24, 32, 2, seed=0, dtype=torch.bfloat16)
    info = inspect_file(save(tmp_path / "a.safetensors", lora_keys("blocks.1.attn.out_proj", down, up)), shapes=TINY_SHAPES)
    assert info.dtype == "BF16" and info.targets == ("transformer_blocks.1.attn.to_out.0",)
