"""Small, deterministic demo adapters for the embedded tiny checkpoint, one per layout in circulation.

    python -m h3app.adapters.demo DIR

Each file mimics a real producer's key layout and alpha convention at tiny dims (see docs/adapters.md):

- ``native_larry_mixed_rank.safetensors``: bare native names, ranks 8 (attention, FFN) / 2 (AdaLN), no alpha,
  BF16 — like larryvrh/MiniMax-H3-Turbo-Lora.
- ``native_comfyui_alpha.safetensors``: ``diffusion_model.`` + native names, ``lora_down``/``lora_up`` and F32
  ``.alpha`` scalars — like LightX2V's ComfyUI variants.
- ``peft_diffusers_metadata.safetensors``: ``transformer.`` + diffusers names incl. the global projections, alpha in
  diffusers' ``lora_adapter_metadata`` with an ``alpha_pattern``.
- ``kohya_musubi.safetensors``: musubi's flattened ``lora_unet_`` names, fractional ``.alpha`` 1.5.
- ``diffsynth_interleaved.safetensors``: native names with ``.default.``, per-head interleaved QKV, F32.
- ``lightx2v_turbo_no_alpha.safetensors``: rank 128, diffusers names with ``.default.``, no prefix, no alpha anywhere (the
  case where alpha = rank is a guess).
- ``peft_rslora/adapter_model.safetensors`` + ``adapter_config.json``: ``base_model.model.`` prefix, rsLoRA and an
  ``alpha_pattern`` (in its own folder, since a sidecar config applies to every file beside it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

import torch

from ..model.tiny_training.lora import write_canonical as _write
from ..rules.h3_modules import TransformerShapes, transformer_shapes
from .formats import native_vocabulary

SEED = 3


def tiny_shapes() -> TransformerShapes:
    from ..model.tiny import TINY_TRANSFORMER_CONFIG

    return transformer_shapes(TINY_TRANSFORMER_CONFIG)


LIGHTX2V_DEMO_RANK = 128


def _factors(out_features: int, in_features: int, rank: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """lora_A ``[rank, in]`` and lora_B ``[out, rank]``, both non-zero so the demo visibly changes the output."""
    down = torch.randn(rank, in_features, generator=generator) * 0.3
    up = torch.randn(out_features, rank, generator=generator) * 0.3
    return down, up


def _native_files(shapes: TransformerShapes, generator: torch.Generator) -> dict[str, Callable[[Path], Path]]:
    vocabulary = native_vocabulary(shapes)
    block_modules = [n for n in vocabulary if n.startswith(("blocks.", "token_refiner.")) and "adaln" not in n]
    adaln = [n for n in vocabulary if n.startswith("blocks.") and "adaln" in n]

    def larry(path: Path) -> Path:
        tensors = {}
        for name in block_modules + adaln:
            down, up = _factors(*vocabulary[name], 2 if "adaln" in name else 8, generator)
            tensors[f"{name}.lora_A.weight"] = down.to(torch.bfloat16)
            tensors[f"{name}.lora_B.weight"] = up.to(torch.bfloat16)
        return _write(path, tensors)

    def comfyui(path: Path) -> Path:
        tensors = {}
        for name in block_modules:
            down, up = _factors(*vocabulary[name], 8, generator)
            tensors[f"diffusion_model.{name}.lora_down.weight"] = down.to(torch.bfloat16)
            tensors[f"diffusion_model.{name}.lora_up.weight"] = up.to(torch.bfloat16)
            tensors[f"diffusion_model.{name}.alpha"] = torch.tensor(2.0, dtype=torch.float32)
        return _write(path, tensors)

    def kohya(path: Path) -> Path:
        tensors = {}
        chosen = block_modules + adaln + ["time_embedder.proj_in", "final_layer.video_out"]
        for name in chosen:
            stem = "lora_unet_" + name.replace(".", "_")
            down, up = _factors(*vocabulary[name], 4, generator)
            tensors[f"{stem}.lora_down.weight"] = down
            tensors[f"{stem}.lora_up.weight"] = up
            tensors[f"{stem}.alpha"] = torch.tensor(1.5)
        return _write(path, tensors, {"ss_network_alpha": "1.5", "ss_network_dim": "4", "ss_network_module": "networks.lora"})

    def diffsynth(path: Path) -> Path:
        tensors = {}
        for name in block_modules:
            down, up = _factors(*vocabulary[name], 4, generator)
            tensors[f"{name}.lora_A.default.weight"] = down
            tensors[f"{name}.lora_B.default.weight"] = up  # random rows: any order is a valid interleaved layout
        return _write(path, tensors)

    return {
        "native_larry_mixed_rank.safetensors": larry,
        "native_comfyui_alpha.safetensors": comfyui,
        "kohya_musubi.safetensors": kohya,
        "diffsynth_interleaved.safetensors": diffsynth,
    }


def _diffusers_files(shapes: TransformerShapes, generator: torch.Generator) -> dict[str, Callable[[Path], Path]]:
    six = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")
    turbo_targets = [t for t in shapes.linears if t.endswith(six)]

    def peft_metadata(path: Path) -> Path:
        tensors = {}
        for target in shapes.linears:
            linear = shapes[target]
            down, up = _factors(linear.out_features, linear.in_features, 4, generator)
            tensors[f"transformer.{target}.lora_A.weight"] = down
            tensors[f"transformer.{target}.lora_B.weight"] = up
        config = {"r": 4, "lora_alpha": 2, "alpha_pattern": {"^norm_out.linear": 1}, "rank_pattern": {},
                  "target_modules": sorted(shapes.linears), "use_rslora": False, "use_dora": False, "lora_bias": False}
        metadata = {"format": "pt", "lora_adapter_metadata": json.dumps({f"transformer.{k}": v for k, v in config.items()}, sort_keys=True)}
        return _write(path, tensors, metadata)

    def lightx2v(path: Path) -> Path:
        tensors = {}
        for target in turbo_targets:
            linear = shapes[target]
            # rank 128 like the real Turbo file: at alpha = rank it is 16x stronger than at its intended alpha 8
            down, up = _factors(linear.out_features, linear.in_features, LIGHTX2V_DEMO_RANK, generator)
            tensors[f"{target}.lora_A.default.weight"] = down.to(torch.bfloat16)
            tensors[f"{target}.lora_B.default.weight"] = up.to(torch.bfloat16)
        return _write(path, tensors)

    def peft_rslora(path: Path) -> Path:
        tensors = {}
        for target in turbo_targets:
            linear = shapes[target]
            down, up = _factors(linear.out_features, linear.in_features, 4, generator)
            tensors[f"base_model.model.{target}.lora_A.weight"] = down
            tensors[f"base_model.model.{target}.lora_B.weight"] = up
        written = _write(path, tensors)
        config = {"peft_type": "LORA", "r": 4, "lora_alpha": 4, "use_rslora": True, "alpha_pattern": {"ff.net.2": 2},
                  "rank_pattern": {}, "target_modules": ["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2"]}
        path.with_name("adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        return written

    return {
        "peft_diffusers_metadata.safetensors": peft_metadata,
        "lightx2v_turbo_no_alpha.safetensors": lightx2v,
        "peft_rslora/adapter_model.safetensors": peft_rslora,
    }


def write_demo_adapters(out_dir: str | Path, shapes: TransformerShapes | None = None) -> list[Path]:
    """Write every demo adapter under ``out_dir`` (deterministic bytes); returns the weight files written."""
    out = Path(out_dir)
    shapes = shapes or tiny_shapes()
    generator = torch.Generator().manual_seed(SEED)
    writers = {**_native_files(shapes, generator), **_diffusers_files(shapes, generator)}
    return [writer(out / name) for name, writer in writers.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m h3app.adapters.demo", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="folder to write the demo adapters into (e.g. assets/adapters)")
    args = parser.parse_args(argv)
    for path in write_demo_adapters(args.out_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
