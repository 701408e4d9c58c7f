"""Oracle: for every format, h3app's ΔW per diffusers module equals diffusers' own conversion + PEFT scaling on the
unfused tiny transformer in fp32 (max|Δ| / max|ref| ≤ 1e-6).

The oracle's limits (docs/adapters.md): its DiffSynth de-interleave hard-codes head_dim 128 (→ the 128-wide-head twin of
the tiny config), it does not strip ``base_model.model.`` or ``model.diffusion_model.`` (→ the prefix is rewritten
for it, or PEFT itself is the oracle), it cannot read flattened diffusers names or 3D stacks (→ ΔW built by hand).
Every third-party call runs under a timeout.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from adapter_fixtures import (
    TINY_128_CONFIG,
    TINY_128_SHAPES,
    TINY_SHAPES,
    delta,
    diffusers_targets,
    factors,
    lora_keys,
    oracle_deltas_diffusers,
    oracle_deltas_peft,
    relative_error,
    save,
)

from h3app.adapters.formats import native_vocabulary
from h3app.adapters.normalise import load_adapter

pytestmark = pytest.mark.slow
TOLERANCE = 1e-6


def assert_matches(adapter, reference: dict[str, torch.Tensor], strength: float = 1.0) -> None:
    assert set(adapter.modules) == set(reference)
    for target, module in adapter.modules.items():
        error = relative_error(delta(module, strength), reference[target])
        assert error <= TOLERANCE, (target, error)


def _all_native(prefix: str = "", style: str = "ab", slot: str | None = None, shapes=TINY_SHAPES, adaln_rank: int = 2,
                rank: int = 4, with_globals: bool = True) -> dict[str, torch.Tensor]:
    """Every native module of ``shapes``: mixed ranks (``adaln_rank`` on AdaLN projections) like Larry's Turbo."""
    tensors: dict[str, torch.Tensor] = {}
    for seed, (name, (out_features, in_features)) in enumerate(native_vocabulary(shapes).items()):
        is_global = not name.startswith(("blocks.", "token_refiner."))
        if is_global and not with_globals:
            continue
        module_rank = adaln_rank if "adaln" in name else rank
        tensors.update(lora_keys(prefix + name, *factors(out_features, in_features, module_rank, seed=seed), style, slot))
    return tensors


def test_native_bare_mixed_ranks_without_alpha(tmp_path: Path) -> None:
    path = save(tmp_path / "larry.safetensors", _all_native())
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    assert adapter.info.format == "native" and set(adapter.info.ranks.values()) == {2, 4}
    assert len(adapter.modules) == len(TINY_SHAPES.linears)
    assert_matches(adapter, oracle_deltas_diffusers(path))


def test_native_comfyui_prefix_kohya_suffixes_and_fractional_alpha_tensors(tmp_path: Path) -> None:
    tensors = _all_native("diffusion_model.", style="du")
    for index, stem in enumerate(sorted({k.rsplit(".lora_", 1)[0] for k in tensors})):
        tensors[f"{stem}.alpha"] = torch.tensor([0.5, 1.5, 3.0, 2.25][index % 4])
    path = save(tmp_path / "comfy.safetensors", tensors)
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    assert adapter.info.alpha_source == "module_tensor" and adapter.info.suffix_style == "lora_down/up"
    assert {m.alpha for m in adapter.modules.values()} == {0.5, 1.5, 3.0, 2.25}
    assert_matches(adapter, oracle_deltas_diffusers(path))


def test_native_model_diffusion_model_prefix(tmp_path: Path) -> None:
    tensors = _all_native("model.diffusion_model.", with_globals=False)
    adapter = load_adapter(save(tmp_path / "a.safetensors", tensors), shapes=TINY_SHAPES)
    assert adapter.info.prefix == "model.diffusion_model."
    # The oracle strips only `diffusion_model.`.
    rewritten = {k.removeprefix("model."): v for k, v in tensors.items()}
    assert_matches(adapter, oracle_deltas_diffusers(rewritten))


def test_kohya_musubi_flattened_native_names_with_alpha(tmp_path: Path) -> None:
    tensors: dict[str, torch.Tensor] = {}
    for seed, (name, shape) in enumerate(native_vocabulary(TINY_SHAPES).items()):
        stem = "lora_unet_" + name.replace(".", "_")
        tensors.update(lora_keys(stem, *factors(*shape, 4, seed=seed), "du"))
        tensors[f"{stem}.alpha"] = torch.tensor(1.5 if seed % 2 else 0.75)
    path = save(tmp_path / "musubi.safetensors", tensors, {"ss_network_alpha": "1.5"})
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    assert adapter.info.format == "kohya" and adapter.info.hints["ss_network_alpha"] == 1.5
    assert_matches(adapter, oracle_deltas_diffusers(path))


def test_kohya_flattened_diffusers_names_by_hand(tmp_path: Path) -> None:
    """diffusers' converter only knows native names under `lora_unet_`; ΔW is built by hand here."""
    tensors: dict[str, torch.Tensor] = {}
    expected: dict[str, torch.Tensor] = {}
    for seed, target in enumerate(TINY_SHAPES.linears):
        linear = TINY_SHAPES[target]
        down, up = factors(linear.out_features, linear.in_features, 4, seed=seed)
        stem = "lora_unet_" + target.replace(".", "_")
        tensors.update(lora_keys(stem, down, up, "du"))
        tensors[f"{stem}.alpha"] = torch.tensor(2.0)
        expected[target] = 0.5 * (up.double() @ down.double())
    adapter = load_adapter(save(tmp_path / "a.safetensors", tensors), shapes=TINY_SHAPES)
    assert adapter.info.format == "kohya"
    assert_matches(adapter, expected)


def test_diffsynth_interleaved_qkv_with_128_wide_heads(tmp_path: Path) -> None:
    tensors = _all_native(slot="default", shapes=TINY_128_SHAPES, with_globals=False)
    path = save(tmp_path / "diffsynth.safetensors", tensors)
    adapter = load_adapter(path, shapes=TINY_128_SHAPES)
    assert adapter.info.format == "diffsynth"
    assert_matches(adapter, oracle_deltas_diffusers(path, config=TINY_128_CONFIG))


def _interleave(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int) -> torch.Tensor:
    heads = q.shape[0] // head_dim
    parts = []
    for h in range(heads):
        rows = slice(h * head_dim, (h + 1) * head_dim)
        parts += [q[rows], k[rows], v[rows]]
    return torch.cat(parts)


@pytest.mark.parametrize("slot, qkv_layout", [("default", "auto"), (None, "interleaved")])
def test_interleaved_qkv_uses_the_model_head_dim_by_hand(tmp_path: Path, slot: str | None, qkv_layout: str) -> None:
    """head_dim 16 (the tiny model): the oracle would assume 128, so the expected ΔW is built from q/k/v by hand."""
    down, _ = factors(1, 24, 4, seed=1)
    q, k, v = (factors(32, 1, 4, seed=s)[1] for s in (2, 3, 4))
    tensors = lora_keys("blocks.1.attn.qkv_proj", down, _interleave(q, k, v, head_dim=16), slot=slot)
    adapter = load_adapter(save(tmp_path / "a.safetensors", tensors), shapes=TINY_SHAPES, qkv_layout=qkv_layout)
    expected = {f"transformer_blocks.1.attn.to_{name}": up.double() @ down.double() for name, up in zip("qkv", (q, k, v))}
    assert_matches(adapter, expected)
    blocked = load_adapter(save(tmp_path / "b.safetensors", lora_keys("blocks.1.attn.qkv_proj", down, torch.cat([q, k, v]))),
                           shapes=TINY_SHAPES)
    assert_matches(blocked, expected)


def test_peft_transformer_prefix_with_diffusers_metadata(tmp_path: Path) -> None:
    tensors = diffusers_targets("transformer.")
    config = {"r": 4, "lora_alpha": 2, "alpha_pattern": {"^norm_out.linear": 1, "^transformer_blocks.1.ff.net.2": 3.5},
              "rank_pattern": {}, "target_modules": sorted(TINY_SHAPES.linears), "use_rslora": False}
    metadata = {"format": "pt", "lora_adapter_metadata": json.dumps({f"transformer.{k}": v for k, v in config.items()})}
    path = save(tmp_path / "pytorch_lora_weights.safetensors", tensors, metadata)
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    assert adapter.modules["transformer_blocks.1.ff.net.2"].alpha == 3.5
    assert_matches(adapter, oracle_deltas_diffusers(path))


def test_peft_lightx2v_default_slot_without_alpha_and_with_explicit_alpha(tmp_path: Path) -> None:
    six = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")
    turbo = tuple(t for t in TINY_SHAPES.linears if t.endswith(six))
    path = save(tmp_path / "turbo.safetensors", diffusers_targets("", targets=turbo, rank=8, slot="default"))
    reference = oracle_deltas_diffusers(path)
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    assert adapter.info.alpha_source == "rank_fallback" and len(adapter.modules) == 24
    assert_matches(adapter, reference)
    explicit = load_adapter(path, shapes=TINY_SHAPES, explicit_alpha=0.5)
    assert explicit.info.alpha_source == "explicit"
    assert_matches(explicit, {t: d * (0.5 / 8) for t, d in reference.items()})


def test_peft_metadata_alpha_entry_as_diffusers_honours_it(tmp_path: Path) -> None:
    path = save(tmp_path / "a.safetensors", diffusers_targets("", rank=8, slot="default"), {"alpha": "8"})
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    assert adapter.info.alpha == 8.0 and adapter.info.alpha_source == "metadata"
    assert_matches(adapter, oracle_deltas_diffusers(path))


@pytest.mark.parametrize("use_rslora", [False, True])
def test_peft_base_model_prefix_with_adapter_config_against_peft(tmp_path: Path, use_rslora: bool) -> None:
    folder = tmp_path / "adapter"
    save(folder / "adapter_model.safetensors", diffusers_targets("base_model.model.", rank=4))
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 6, "use_rslora": use_rslora,
              "alpha_pattern": {} if use_rslora else {"ff.net.2": 3}, "rank_pattern": {},
              "target_modules": sorted(TINY_SHAPES.linears)}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    adapter = load_adapter(folder / "adapter_model.safetensors", shapes=TINY_SHAPES)
    assert adapter.info.alpha_source == "adapter_config" and adapter.info.use_rslora == use_rslora
    reference = oracle_deltas_peft(folder)
    assert_matches(adapter, reference)
    if use_rslora:  # explicit alpha replaces alpha only: still / √rank
        explicit = load_adapter(folder / "adapter_model.safetensors", shapes=TINY_SHAPES, explicit_alpha=3.0)
        assert all(m.use_rslora for m in explicit.modules.values())
        assert_matches(explicit, {t: d * 0.5 for t, d in reference.items()})


def test_reference_partition_file_loaded_for_ref2va(tmp_path: Path) -> None:
    path = save(tmp_path / "ref.safetensors", diffusers_targets("transformer_ref.", rank=4))
    adapter = load_adapter(path, shapes=TINY_SHAPES, partition="transformer_ref")
    assert_matches(adapter, oracle_deltas_diffusers(path, prefix="transformer_ref"))
    main = load_adapter(save(tmp_path / "mixed.safetensors", diffusers_targets("transformer.") | diffusers_targets("transformer_ref.", seed=7)),
                        shapes=TINY_SHAPES)
    assert set(main.reference_modules) == set(TINY_SHAPES.linears)
    assert any("for the reference partition (transformer_ref), not applied" in w for w in main.info.warnings)


def test_three_dimensional_qkv_stack_by_hand(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(11)
    downs, ups = torch.randn(3, 4, 24, generator=generator), torch.randn(3, 32, 4, generator=generator)
    tensors = {"blocks.0.attn.qkv_proj.lora_A.weight": downs, "blocks.0.attn.qkv_proj.lora_B.weight": ups,
               "blocks.0.attn.qkv_proj.alpha": torch.tensor(2.0)}
    adapter = load_adapter(save(tmp_path / "a.safetensors", tensors), shapes=TINY_SHAPES)
    expected = {f"transformer_blocks.0.attn.to_{p}": 0.5 * (ups[i].double() @ downs[i].double()) for i, p in enumerate("qkv")}
    assert_matches(adapter, expected)


def test_swiglu_halves_swap_when_crossing_native_to_diffusers(tmp_path: Path) -> None:
    """A native fc1 delta [gate; up] must land as diffusers' [up; gate], checked directly on rows."""
    down, up = factors(64, 24, 4, seed=21)
    adapter = load_adapter(save(tmp_path / "a.safetensors", lora_keys("blocks.0.mlp.fc1", down, up)), shapes=TINY_SHAPES)
    module = adapter.modules["transformer_blocks.0.ff.net.0.proj"]
    assert torch.equal(module.up[:32], up[32:]) and torch.equal(module.up[32:], up[:32])
    assert torch.equal(module.down, down)


def test_rslora_scale_is_alpha_over_sqrt_rank(tmp_path: Path) -> None:
    folder = tmp_path / "r"
    save(folder / "adapter_model.safetensors", diffusers_targets("base_model.model.", targets=("proj_in",), rank=9))
    (folder / "adapter_config.json").write_text(json.dumps({"r": 9, "lora_alpha": 6, "use_rslora": True}))
    module = load_adapter(folder / "adapter_model.safetensors", shapes=TINY_SHAPES).modules["proj_in"]
    expected = 6 / math.sqrt(9) * (module.up.double() @ module.down.double())
    assert relative_error(delta(module), expected) <= 1e-12
