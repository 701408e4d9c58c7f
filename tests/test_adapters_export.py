"""h3app.adapters.export: the exported adapter applies h3app's ΔW (alpha × strength baked in) when loaded by
diffusers (lora_adapter_metadata) and by PEFT (adapter_config.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from adapter_fixtures import (
    TINY_CONFIG,
    TINY_SHAPES,
    delta,
    diffusers_targets,
    native_block,
    oracle_deltas_diffusers,
    oracle_deltas_peft,
    relative_error,
    save,
)
from safetensors import safe_open

from h3app.adapters.export import export_adapter, parse_export_dtype
from h3app.adapters.normalise import load_adapter
from h3app.errors import H3AppError

TOLERANCE = 1e-6


def _mixed_adapter(tmp_path: Path):
    """Mixed ranks (4 and 2) and mixed alphas (.alpha tensors on some modules, rank fallback elsewhere)."""
    tensors = native_block("", 0, rank=4) | native_block("", 1, rank=2, modules=("adaln_proj.linear", "mlp.fc2"))
    tensors["blocks.0.attn.qkv_proj.alpha"] = torch.tensor(1.5)
    tensors["blocks.1.mlp.fc2.alpha"] = torch.tensor(0.25)
    return load_adapter(save(tmp_path / "mixed.safetensors", tensors), shapes=TINY_SHAPES)


def _assert_same_delta(adapter, reference: dict[str, torch.Tensor], strength: float) -> None:
    assert set(reference) == set(adapter.modules)
    for target, module in adapter.modules.items():
        error = relative_error(reference[target], delta(module, strength))
        assert error <= TOLERANCE, (target, error)


@pytest.mark.slow
@pytest.mark.parametrize("strength", [0.7, -1.0])
def test_diffusers_and_peft_apply_h3app_delta(tmp_path: Path, strength: float) -> None:
    adapter = _mixed_adapter(tmp_path)
    result = export_adapter(adapter, tmp_path / "out", strength=strength)
    assert result.lora_config["rank_pattern"] and result.lora_config["alpha_pattern"]
    assert result.lora_config["use_rslora"] is False
    _assert_same_delta(adapter, oracle_deltas_diffusers(result.weights), strength)
    _assert_same_delta(adapter, oracle_deltas_peft(result.weights.parent, strip="transformer."), strength)


@pytest.mark.slow
def test_rslora_is_baked_in_and_explicit_alpha_respected(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    save(folder / "adapter_model.safetensors", diffusers_targets("base_model.model.", rank=9))
    (folder / "adapter_config.json").write_text(json.dumps({"r": 9, "lora_alpha": 6, "use_rslora": True}))
    adapter = load_adapter(folder / "adapter_model.safetensors", shapes=TINY_SHAPES, explicit_alpha=4.5)
    assert all(m.use_rslora and m.alpha == 4.5 for m in adapter.modules.values())
    result = export_adapter(adapter, tmp_path / "out", strength=2.0)
    assert result.lora_config["lora_alpha"] == pytest.approx(4.5 * 2.0 / 3 * 9)
    _assert_same_delta(adapter, oracle_deltas_diffusers(result.weights), 2.0)
    _assert_same_delta(adapter, oracle_deltas_peft(result.weights.parent, strip="transformer."), 2.0)


def test_h3app_reads_its_export_back_through_config_and_metadata(tmp_path: Path) -> None:
    adapter = _mixed_adapter(tmp_path)
    result = export_adapter(adapter, tmp_path / "out", strength=0.5)
    again = load_adapter(result.weights, shapes=TINY_SHAPES)
    assert again.info.format == "peft" and again.info.prefix == "transformer."
    assert again.info.alpha_source == "adapter_config"
    for target, module in adapter.modules.items():
        assert relative_error(delta(again.modules[target]), delta(module, 0.5)) <= TOLERANCE
    result.config.unlink()
    from_metadata = load_adapter(result.weights, shapes=TINY_SHAPES)
    assert from_metadata.info.alpha_source == "metadata"
    for target, module in adapter.modules.items():
        assert relative_error(delta(from_metadata.modules[target]), delta(module, 0.5)) <= TOLERANCE


def test_file_layout_keys_dtype_and_configs(tmp_path: Path) -> None:
    adapter = _mixed_adapter(tmp_path)
    result = export_adapter(adapter, tmp_path / "out", strength=1.0, dtype=torch.bfloat16, base_model="tiny")
    with safe_open(str(result.weights), framework="pt") as handle:
        keys = set(handle.keys())
        metadata = handle.metadata()
        assert handle.get_slice("transformer.transformer_blocks.0.attn.to_q.lora_A.weight").get_dtype() == "BF16"
    assert keys == {f"transformer.{t}.lora_{ab}.weight" for t in adapter.modules for ab in "AB"}
    packed = json.loads(metadata["lora_adapter_metadata"])
    config = json.loads(result.config.read_text())
    assert packed["transformer.r"] == config["r"] == 4
    assert packed["transformer.rank_pattern"] == config["rank_pattern"] == {
        "^transformer_blocks.1.adaln_proj.linear": 2, "^transformer_blocks.1.ff.net.2": 2}
    assert config["peft_type"] == "LORA" and config["use_rslora"] is False and config["base_model_name_or_path"] == "tiny"
    assert config["alpha_pattern"]["^transformer_blocks.1.ff.net.2"] == 0.25 and config["lora_alpha"] == 4.0
    assert result.to_json()["num_targets"] == len(adapter.modules)


def test_refusals(tmp_path: Path) -> None:
    adapter = _mixed_adapter(tmp_path)
    with pytest.raises(H3AppError, match="scale 0 would export an adapter that does nothing"):
        export_adapter(adapter, tmp_path / "out", strength=0.0)
    with pytest.raises(H3AppError, match="scale must be finite"):
        export_adapter(adapter, tmp_path / "out", strength=float("nan"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(H3AppError, match="is not a folder"):
        export_adapter(adapter, tmp_path / "file")
    with pytest.raises(H3AppError, match="--dtype must be one of"):
        parse_export_dtype("int4")


def _both_partitions_pipeline():
    """What diffusers' H3 pipelines hold for LoRA loading: ``MiniMaxH3LoraLoaderMixin`` over a ``transformer`` and a
    ``transformer_ref`` (fresh tiny fp32 transformers), so ``load_lora_weights`` routes by the keys' prefix."""
    from diffusers import MiniMaxH3Transformer3DModel
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    class Pipeline(MiniMaxH3LoraLoaderMixin):
        hf_device_map = None  # what diffusers' offload check reads on a pipeline

        @property
        def components(self) -> dict:
            return {"transformer": self.transformer, "transformer_ref": self.transformer_ref}

        def __init__(self) -> None:
            self.transformer = MiniMaxH3Transformer3DModel(**TINY_CONFIG)
            self.transformer_ref = MiniMaxH3Transformer3DModel(**TINY_CONFIG)

    return Pipeline()


@pytest.mark.parametrize("partition", ["transformer", "transformer_ref"])
def test_export_names_the_partition_diffusers_loads_it_into(tmp_path: Path, partition: str) -> None:
    from adapter_fixtures import _peft_deltas, call_with_timeout

    tensors = native_block("", 0, rank=4)
    tensors["blocks.0.attn.qkv_proj.alpha"] = torch.tensor(1.5)
    adapter = load_adapter(save(tmp_path / "plain.safetensors", tensors), shapes=TINY_SHAPES, partition=partition)
    result = export_adapter(adapter, tmp_path / "out", strength=0.5, partition=partition)
    assert result.to_json()["partition"] == partition
    with safe_open(str(result.weights), framework="pt") as handle:
        assert all(key.startswith(f"{partition}.transformer_blocks.") for key in handle.keys())
        assert all(key.startswith(f"{partition}.") for key in json.loads(handle.metadata()["lora_adapter_metadata"]))

    def load() -> tuple[dict, dict]:
        pipe = _both_partitions_pipeline()
        pipe.load_lora_weights(str(result.weights.parent), weight_name=result.weights.name, adapter_name="export")
        return _peft_deltas(pipe.transformer, "export"), _peft_deltas(pipe.transformer_ref, "export")

    main, reference = call_with_timeout(load)
    landed, untouched = (reference, main) if partition == "transformer_ref" else (main, reference)
    assert untouched == {}
    _assert_same_delta(adapter, landed, 0.5)
    # h3app reads its own export back for the same partition (and names it as the other partition's otherwise).
    again = load_adapter(result.weights, shapes=TINY_SHAPES, partition=partition)
    for target, module in adapter.modules.items():
        assert relative_error(delta(again.modules[target]), delta(module, 0.5)) <= TOLERANCE
    if partition == "transformer_ref":
        with pytest.raises(H3AppError, match="nothing in adapter_model.safetensors applies to the transformer partition"):
            load_adapter(result.weights, shapes=TINY_SHAPES)


def test_export_refuses_an_unknown_partition(tmp_path: Path) -> None:
    with pytest.raises(H3AppError, match="partition must be one of transformer, transformer_ref"):
        export_adapter(_mixed_adapter(tmp_path), tmp_path / "out", partition="transformer_2")
