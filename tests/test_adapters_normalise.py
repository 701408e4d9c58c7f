"""h3app.adapters.normalise: factors read, reordered and checked; what load refuses that inspection only reports."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from adapter_fixtures import TINY_128_SHAPES, TINY_SHAPES, diffusers_targets, factors, lora_keys, native_block, save

from h3app.adapters.normalise import deinterleave_qkv, load_adapter
from h3app.errors import H3AppError


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_factors_are_refused(tmp_path: Path, bad: float) -> None:
    down, up = factors(24, 32, 2, seed=1)
    up[3, 1] = bad
    path = save(tmp_path / "a.safetensors", lora_keys("blocks.0.attn.out_proj", down, up))
    with pytest.raises(H3AppError, match=r"'blocks.0.attn.out_proj.lora_B.weight' has 1 NaN/Inf values"):
        load_adapter(path, shapes=TINY_SHAPES)


def test_shapes_are_always_checked_at_load(tmp_path: Path) -> None:
    path = save(tmp_path / "a.safetensors", native_block("", 0) | native_block("", 1))
    with pytest.raises(H3AppError) as caught:
        load_adapter(path, shapes=TINY_128_SHAPES)
    message = str(caught.value)
    assert "does not fit the model in use" in message and "LoRA 32×24 vs model 256×24" in message
    assert "(+5 more)" in message and "\n" not in message


def test_reference_only_file_is_refused_for_the_main_partition(tmp_path: Path) -> None:
    path = save(tmp_path / "a.safetensors", diffusers_targets("transformer_ref."))
    with pytest.raises(H3AppError, match="load it for the ref2va workflow"):
        load_adapter(path, shapes=TINY_SHAPES)


def test_modules_keep_the_file_dtype_source_keys_and_share_lora_a(tmp_path: Path) -> None:
    tensors = native_block("diffusion_model.", 0, rank=4, modules=("attn.qkv_proj",))
    tensors = {k: v.to(torch.bfloat16) for k, v in tensors.items()}
    path = save(tmp_path / "a.safetensors", tensors)
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    q, k, v = (adapter.modules[f"transformer_blocks.0.attn.to_{p}"] for p in "qkv")
    assert q.down.dtype == torch.bfloat16 and q.up.shape == (32, 4) and q.rank == 4
    assert torch.equal(q.down, k.down) and torch.equal(k.down, v.down)
    up = tensors["diffusion_model.blocks.0.attn.qkv_proj.lora_B.weight"]
    assert torch.equal(torch.cat([q.up, k.up, v.up]), up)
    assert q.source_keys == ("diffusion_model.blocks.0.attn.qkv_proj.lora_A.weight", "diffusion_model.blocks.0.attn.qkv_proj.lora_B.weight")
    assert str(path.resolve()) in adapter.identity
    assert adapter.unmatched_keys == () and adapter.reference_modules == {}


def test_identity_names_the_repo_when_known(tmp_path: Path) -> None:
    path = save(tmp_path / "x.safetensors", native_block("", 0))
    adapter = load_adapter(path, shapes=TINY_SHAPES, repo_id="someone/lora", filename="x.safetensors")
    assert adapter.identity.startswith("someone/lora/x.safetensors:")


def test_deinterleave_inverts_the_per_head_layout() -> None:
    heads, head_dim, rank = 3, 4, 2
    q, k, v = (torch.arange(heads * head_dim * rank, dtype=torch.float32).reshape(-1, rank) + 1000 * i for i in range(3))
    interleaved = torch.cat([part for h in range(heads) for part in (q[h * head_dim:(h + 1) * head_dim],
                                                                     k[h * head_dim:(h + 1) * head_dim],
                                                                     v[h * head_dim:(h + 1) * head_dim])])
    assert torch.equal(deinterleave_qkv(interleaved, head_dim), torch.cat([q, k, v]))
    with pytest.raises(H3AppError, match="not a multiple of 3 × head_dim 5"):
        deinterleave_qkv(interleaved, 5)


def test_a_header_alone_normalises_like_the_file_but_for_the_values(tmp_path: Path) -> None:
    """One normaliser, two factor readers: the file's tensors (``load_adapter``) or uninitialised tensors of the
    header's shapes and dtypes (``adapter_from_header``) give the same targets, shapes, dtypes, alphas and keys."""
    from h3app.adapters.header import read_local_header
    from h3app.hardware.header_adapter import adapter_from_header

    tensors = native_block("", 0, rank=4) | diffusers_targets("transformer_ref.", seed=3)
    path = save(tmp_path / "mixed.safetensors", {k: v.to(torch.bfloat16) for k, v in tensors.items()})
    loaded = load_adapter(path, shapes=TINY_SHAPES, explicit_alpha=3.0)
    planned = adapter_from_header(read_local_header(path), TINY_SHAPES, explicit_alpha=3.0)

    def described(modules: dict) -> dict:
        return {target: (m.down.shape, m.down.dtype, m.up.shape, m.up.dtype, m.alpha, m.alpha_source, m.use_rslora,
                         m.source_keys) for target, m in modules.items()}

    assert loaded.modules and loaded.reference_modules
    assert described(planned.modules) == described(loaded.modules)
    assert described(planned.reference_modules) == described(loaded.reference_modules)
    assert planned.info == loaded.info and planned.unmatched_keys == loaded.unmatched_keys
    assert planned.identity == f"header:mixed.safetensors:{path.stat().st_size}"
