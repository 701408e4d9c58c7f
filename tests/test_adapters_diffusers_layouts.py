"""The key layouts diffusers' own MiniMax-H3 LoRA tests load, read by h3app with the alpha diffusers gives them:
h3app's ΔW per module equals diffusers' (its ``lora_state_dict`` and ``load_lora_adapter`` on the tiny transformer).

Covered elsewhere (tests/test_adapters_oracle.py): native fused names bare / ``diffusion_model.`` with mixed ranks,
``transformer.``/``transformer_ref.`` diffusers keys, a ``__metadata__`` ``alpha``. Here: what diffusers'
``save_lora_weights`` writes (its ``lora_adapter_metadata`` included), a PEFT dump (``.default.`` slot, no prefix)
with mixed ranks, the exact mixed-rank module set diffusers tests (refiner qkv, final AdaLN), per-module ``.alpha``
scalars beside a metadata alpha (the scalars win on their modules; diffusers then also drops the metadata alpha
for the other modules, which h3app's per-module chain does not), and a metadata alpha that is not a number (ignored).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from adapter_fixtures import TINY_CONFIG, TINY_SHAPES, delta, factors, oracle_deltas_diffusers, relative_error
from safetensors.torch import save_file

from h3app.adapters.normalise import load_adapter

pytestmark = pytest.mark.slow
TOLERANCE = 1e-6
HIDDEN = TINY_CONFIG["hidden_size"]
INNER = TINY_CONFIG["num_attention_heads"] * TINY_CONFIG["attention_head_dim"]
FFN = TINY_CONFIG["ffn_dim"]
TIME = TINY_CONFIG["time_embed_dim"]
# The modules diffusers' H3 LoRA tests build (diffusers names), with (in, out) and which of the two ranks they use.
DIFFUSERS_MODULES = (
    ("transformer_blocks.0.attn.to_q", HIDDEN, INNER, "rank"),
    ("transformer_blocks.0.attn.to_out.0", INNER, HIDDEN, "rank"),
    ("transformer_blocks.0.ff.net.0.proj", HIDDEN, 2 * FFN, "rank"),
    ("transformer_blocks.0.ff.net.2", FFN, HIDDEN, "rank"),
    ("transformer_blocks.0.adaln_proj.linear", TIME, 18 * HIDDEN, "adaln"),
    ("norm_out.linear", TIME, 2 * HIDDEN, "adaln"),
)
NATIVE_MODULES = (
    ("blocks.0.attn.qkv_proj", HIDDEN, 3 * INNER, "rank"),
    ("blocks.0.attn.out_proj", INNER, HIDDEN, "rank"),
    ("blocks.0.mlp.fc1", HIDDEN, 2 * FFN, "rank"),
    ("blocks.0.mlp.fc2", FFN, HIDDEN, "rank"),
    ("blocks.0.adaln_proj.linear", TIME, 18 * HIDDEN, "adaln"),
    ("token_refiner.blocks.0.attn.qkv_proj", HIDDEN, 3 * INNER, "rank"),
    ("final_layer.adaln_proj.linear", TIME, 2 * HIDDEN, "adaln"),
)


def _state_dict(modules, prefix: str, rank: int = 8, adaln_rank: int = 2, slot: str | None = None) -> dict:
    tensors = {}
    infix = f".{slot}" if slot else ""
    for seed, (name, in_features, out_features, kind) in enumerate(modules):
        down, up = factors(out_features, in_features, rank if kind == "rank" else adaln_rank, seed=seed)
        tensors[f"{prefix}{name}.lora_A{infix}.weight"] = down
        tensors[f"{prefix}{name}.lora_B{infix}.weight"] = up
    return tensors


def _assert_matches(adapter, reference) -> None:
    assert set(adapter.modules) == set(reference)
    for target, module in adapter.modules.items():
        assert relative_error(delta(module), reference[target]) <= TOLERANCE, target


@pytest.mark.parametrize("prefix", ["diffusion_model.", ""])
def test_native_layout_of_diffusers_tests_lands_at_unit_scale(tmp_path: Path, prefix: str) -> None:
    path = tmp_path / "native.safetensors"
    save_file(_state_dict(NATIVE_MODULES, prefix), str(path))
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    assert len(adapter.modules) == 11  # 3 split qkv, to_out, two ff, adaln, the refiner's 3 qkv, norm_out
    assert {m.alpha / m.rank for m in adapter.modules.values()} == {1.0}
    _assert_matches(adapter, oracle_deltas_diffusers(path))


def test_peft_dump_with_default_slot_and_no_prefix(tmp_path: Path) -> None:
    path = tmp_path / "dump.safetensors"
    save_file(_state_dict(DIFFUSERS_MODULES, "", slot="default"), str(path))
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    assert {m.alpha / m.rank for m in adapter.modules.values()} == {1.0}
    _assert_matches(adapter, oracle_deltas_diffusers(path))


@pytest.mark.parametrize("partition", ["transformer", "transformer_ref"])
def test_what_diffusers_save_lora_weights_writes(tmp_path: Path, partition: str) -> None:
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    layers = _state_dict(DIFFUSERS_MODULES, "")
    metadata = {"r": 8, "lora_alpha": 4, "rank_pattern": {"^transformer_blocks.0.adaln_proj.linear": 2,
                                                          "^norm_out.linear": 2},
                "alpha_pattern": {"^norm_out.linear": 3}, "target_modules": sorted(m[0] for m in DIFFUSERS_MODULES)}
    MiniMaxH3LoraLoaderMixin.save_lora_weights(tmp_path, **{f"{partition}_lora_layers": layers,
                                                            f"{partition}_lora_adapter_metadata": metadata})
    path = tmp_path / "pytorch_lora_weights.safetensors"
    adapter = load_adapter(path, shapes=TINY_SHAPES, partition=partition)
    assert adapter.modules["norm_out.linear"].alpha == 3 and adapter.modules["transformer_blocks.0.attn.to_q"].alpha == 4
    assert {m.alpha_source for m in adapter.modules.values()} == {"metadata"}
    _assert_matches(adapter, oracle_deltas_diffusers(path, prefix=partition))


def test_alpha_scalars_win_over_a_metadata_alpha(tmp_path: Path) -> None:
    tensors = _state_dict(NATIVE_MODULES, "diffusion_model.", rank=8, adaln_rank=8)
    tensors["diffusion_model.blocks.0.mlp.fc2.alpha"] = torch.tensor(2.0)
    path = tmp_path / "both.safetensors"
    save_file(tensors, str(path), metadata={"alpha": "4", "floating_dtype": "bfloat16"})
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    reference = oracle_deltas_diffusers(path)
    fc2 = "transformer_blocks.0.ff.net.2"
    assert adapter.modules[fc2].alpha == 2.0
    assert relative_error(delta(adapter.modules[fc2]), reference[fc2]) <= TOLERANCE


def test_a_metadata_alpha_that_is_not_a_number_is_ignored_like_diffusers(tmp_path: Path) -> None:
    path = tmp_path / "odd.safetensors"
    save_file(_state_dict(DIFFUSERS_MODULES, "transformer.", rank=8, adaln_rank=8), str(path),
              metadata={"alpha": "eight"})
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    assert {m.alpha for m in adapter.modules.values()} == {8.0}
    assert any("not a number" in w for w in adapter.info.warnings)
    _assert_matches(adapter, oracle_deltas_diffusers(path))
