"""Key spellings sglang accepts (factor keys without ``.weight``), files mixing both spellings, and PEFT's own
rules for ``alpha_pattern`` and a missing ``lora_alpha`` (oracle: the installed peft)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from adapter_fixtures import TINY_SHAPES, diffusers_targets, factors, native_block, save

from h3app.adapters.formats import native_vocabulary, plan_adapter
from h3app.adapters.inspect import inspect_header
from h3app.adapters.normalise import load_adapter
from h3app.adapters.types import HeaderView
from h3app.rules.h3_modules import FULL_SIZE_CONFIG, transformer_shapes

FULL_SHAPES = transformer_shapes(FULL_SIZE_CONFIG)


def drop_weight_suffix(tensors: dict[str, torch.Tensor], only=lambda key: True) -> dict[str, torch.Tensor]:
    """sglang's spelling: ``…lora_A`` / ``…lora_B`` (``only`` picks which keys lose the suffix)."""
    return {(key.removesuffix(".weight") if only(key) else key): value for key, value in tensors.items()}


def tiny_native_all() -> dict[str, torch.Tensor]:
    """Every native module of the tiny transformer (fused QKV, SwiGLU fc1, refiner, embedders), rank 4."""
    tensors: dict[str, torch.Tensor] = {}
    for offset, (name, (out_features, in_features)) in enumerate(native_vocabulary(TINY_SHAPES).items()):
        down, up = factors(out_features, in_features, 4, seed=offset)
        tensors[f"{name}.lora_A.weight"], tensors[f"{name}.lora_B.weight"] = down, up
    return tensors


def full_size_native_header(spell=lambda key: key) -> HeaderView:
    """Every native module of the full-size H3, rank 16, BF16, keys respelled by ``spell`` (no file is written)."""
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, (out_features, in_features) in native_vocabulary(FULL_SHAPES).items():
        tensors[spell(f"{name}.lora_A.weight")] = ("BF16", (16, in_features))
        tensors[spell(f"{name}.lora_B.weight")] = ("BF16", (out_features, 16))
    return HeaderView(tensors=tensors, metadata={}, scalars={}, adapter_config=None, file_bytes=0, name="full.safetensors")


def full_size_peft_header(spell=lambda key: key) -> HeaderView:
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    for target, linear in FULL_SHAPES.linears.items():
        tensors[spell(f"transformer.{target}.lora_A.weight")] = ("BF16", (16, linear.in_features))
        tensors[spell(f"transformer.{target}.lora_B.weight")] = ("BF16", (linear.out_features, 16))
    return HeaderView(tensors=tensors, metadata={}, scalars={}, adapter_config=None, file_bytes=0, name="peft.safetensors")


@pytest.mark.parametrize("spelling", ["no_suffix", "mixed"])
def test_tiny_native_file_without_weight_suffix_binds_every_target_like_the_suffixed_one(tmp_path: Path, spelling: str) -> None:
    tensors = tiny_native_all()
    reference = load_adapter(save(tmp_path / "suffixed.safetensors", tensors), shapes=TINY_SHAPES)
    only = (lambda key: True) if spelling == "no_suffix" else (lambda key: not key.startswith("token_refiner."))
    respelled = load_adapter(save(tmp_path / "sglang.safetensors", drop_weight_suffix(tensors, only)), shapes=TINY_SHAPES)

    assert len(reference.modules) == len(TINY_SHAPES)
    assert sorted(respelled.modules) == sorted(reference.modules)
    assert not respelled.unmatched_keys and not respelled.info.unmatched_keys
    for target, module in reference.modules.items():
        assert torch.equal(respelled.modules[target].down, module.down)
        assert torch.equal(respelled.modules[target].up, module.up)


def test_tiny_peft_file_without_weight_suffix_binds_every_target(tmp_path: Path) -> None:
    tensors = diffusers_targets(prefix="transformer.")
    adapter = load_adapter(save(tmp_path / "peft.safetensors", drop_weight_suffix(tensors)), shapes=TINY_SHAPES)
    assert sorted(adapter.modules) == sorted(TINY_SHAPES.linears)
    assert adapter.info.format == "peft" and not adapter.unmatched_keys


@pytest.mark.parametrize("spelling", ["suffixed", "no_suffix", "weight_on_refiner_only", "weight_on_blocks_only"])
def test_full_size_native_header_binds_every_target_in_every_spelling(spelling: str) -> None:
    spell = {
        "suffixed": lambda key: key,
        "no_suffix": lambda key: key.removesuffix(".weight"),
        "weight_on_refiner_only": lambda key: key if key.startswith("token_refiner.") else key.removesuffix(".weight"),
        "weight_on_blocks_only": lambda key: key if key.startswith("blocks.") else key.removesuffix(".weight"),
    }[spelling]
    info = inspect_header(full_size_native_header(spell), shapes=FULL_SHAPES)
    assert info.num_targets == len(FULL_SHAPES) and sorted(info.targets) == sorted(FULL_SHAPES.linears)
    assert info.unmatched_keys == () and info.format == "native"
    assert not any("match no H3 module" in w for w in info.warnings)


@pytest.mark.parametrize("spelling", ["no_suffix", "mixed"])
def test_full_size_peft_header_binds_every_target_without_weight_suffix(spelling: str) -> None:
    spell = ((lambda key: key.removesuffix(".weight")) if spelling == "no_suffix"
             else (lambda key: key.removesuffix(".weight") if ".lora_B" in key else key))
    info = inspect_header(full_size_peft_header(spell), shapes=FULL_SHAPES)
    assert info.num_targets == len(FULL_SHAPES) and info.unmatched_keys == () and info.format == "peft"


def test_a_module_given_in_both_spellings_is_refused_as_two_copies() -> None:
    tensors = native_block(modules=("attn.out_proj",))
    both = {**tensors, **drop_weight_suffix(tensors)}
    view = HeaderView(tensors={k: ("F32", tuple(v.shape)) for k, v in both.items()}, metadata={}, scalars={},
                      adapter_config=None, file_bytes=0, name="both.safetensors")
    from h3app.errors import H3AppError

    with pytest.raises(H3AppError, match="both give the down factor"):
        plan_adapter(view)


# ---------------------------------------------------------------------------------------------------------------
# PEFT's alpha rules, checked against the installed peft
# ---------------------------------------------------------------------------------------------------------------
class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.to_q, self.to_k, self.to_v = (torch.nn.Linear(24, 32, bias=False) for _ in range(3))
        self.to_out = torch.nn.ModuleList([torch.nn.Linear(32, 24, bias=False)])


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = _Attention()


class _Transformer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.transformer_blocks = torch.nn.ModuleList([_Block(), _Block()])


class _Wrapper(torch.nn.Module):
    """A model whose transformer is a submodule: PEFT's module names start with ``transformer.``."""

    def __init__(self) -> None:
        super().__init__()
        self.transformer = _Transformer()


PATTERNS = {
    "^transformer.transformer_blocks.0.attn.to_q": 2.0,  # anchored, with the prefix PEFT saw: matches in PEFT
    "^transformer_blocks.1.attn.to_q": 3.0,  # anchored without it: PEFT's name has the prefix, so no match
    "to_k": 5.0,  # unanchored: matches at a dot boundary
    "1.attn.to_v": 7.0,
}


def peft_alphas(config: dict) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The state dict PEFT saves for ``config`` on ``_Wrapper`` and the alpha PEFT runs each module at."""
    import peft  # requirements-dev pins it: the oracle is PEFT itself, and a broken install must fail
    from peft.utils import get_peft_model_state_dict

    lora_config = peft.LoraConfig(**config)  # what LoraConfig.from_pretrained builds from adapter_config.json
    torch.manual_seed(0)
    model = peft.get_peft_model(_Wrapper(), lora_config)
    for parameter in model.parameters():  # lora_B starts at zero: give it values so the file is a real adapter
        torch.nn.init.normal_(parameter)
    alphas = {}
    for name, module in model.named_modules():
        if hasattr(module, "scaling") and "default" in getattr(module, "scaling", {}):
            target = name.removeprefix("base_model.model.transformer.")
            alphas[target] = module.scaling["default"] * module.r["default"]
    return get_peft_model_state_dict(model), alphas


@pytest.mark.parametrize("with_lora_alpha", [True, False])
def test_alpha_pattern_and_default_alpha_follow_peft(with_lora_alpha: bool) -> None:
    config = {"r": 4, "target_modules": ["to_q", "to_k", "to_v", "to_out.0"], "alpha_pattern": PATTERNS}
    if with_lora_alpha:
        config["lora_alpha"] = 16
    state_dict, expected = peft_alphas(config)
    keys = {f"base_model.model.{k}" if not k.startswith("base_model.model.") else k: v for k, v in state_dict.items()}
    view = HeaderView(tensors={k: ("F32", tuple(v.shape)) for k, v in keys.items()}, metadata={}, scalars={},
                      adapter_config=config, file_bytes=0, name="adapter_model.safetensors")

    info = inspect_header(view)

    assert len(expected) == 8 and set(info.alphas) == set(expected)
    assert {t: info.alphas[t] for t in expected} == pytest.approx(expected)
    assert expected["transformer_blocks.0.attn.to_q"] == 2.0 and expected["transformer_blocks.1.attn.to_v"] == 7.0
    assert set(info.alpha_sources.values()) == {"adapter_config"}
    defaulted = [w for w in info.warnings if "no lora_alpha" in w]
    if with_lora_alpha:
        assert not defaulted
    else:
        assert expected["transformer_blocks.1.attn.to_q"] == 8.0  # PEFT's default, not the rank
        assert defaulted and "PEFT's default 8" in defaulted[0]
