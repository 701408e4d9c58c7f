"""Small, deterministic demo adapters for the embedded tiny checkpoint, one per layout in circulation.

    python -m h3app.model.tiny_training.demo_adapters DIR

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
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from ...rules.h3_modules import BLOCK_LINEARS, TransformerShapes, transformer_shapes
from ...rules.module_rules import native_vocabulary
from .lora import write_canonical as _write

SEED = 3


def tiny_shapes() -> TransformerShapes:
    from ..tiny import TINY_TRANSFORMER_CONFIG

    return transformer_shapes(TINY_TRANSFORMER_CONFIG)


LIGHTX2V_DEMO_RANK = 128


def _factors(out_features: int, in_features: int, rank: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """lora_A ``[rank, in]`` and lora_B ``[out, rank]``, both non-zero so the demo visibly changes the output."""
    down = torch.randn(rank, in_features, generator=generator) * 0.3
    up = torch.randn(out_features, rank, generator=generator) * 0.3
    return down, up


def _lora_tensors(modules: Mapping[str, tuple[int, int]], rank: int, generator: torch.Generator, *, prefix: str = "",
                  factors: tuple[str, str] = ("lora_A.weight", "lora_B.weight"), dtype: torch.dtype = torch.float32,
                  alpha: float | None = None) -> dict[str, torch.Tensor]:
    """``prefix + name + "." + factor`` → random rank-``rank`` factors (down, then up) for each module
    (``name → (out, in)``) in ``dtype``, plus an F32 ``prefix + name + ".alpha"`` scalar when ``alpha`` is given."""
    tensors = {}
    for name, (out_features, in_features) in modules.items():
        down, up = _factors(out_features, in_features, rank, generator)
        tensors[f"{prefix}{name}.{factors[0]}"] = down.to(dtype)
        tensors[f"{prefix}{name}.{factors[1]}"] = up.to(dtype)
        if alpha is not None:
            tensors[f"{prefix}{name}.alpha"] = torch.tensor(alpha, dtype=torch.float32)
    return tensors


def _native_files(shapes: TransformerShapes, generator: torch.Generator) -> dict[str, Callable[[Path], Path]]:
    vocabulary = native_vocabulary(shapes)
    block_modules = {n: dims for n, dims in vocabulary.items()
                     if n.startswith(("blocks.", "token_refiner.")) and "adaln" not in n}
    adaln = {n: dims for n, dims in vocabulary.items() if n.startswith("blocks.") and "adaln" in n}
    down_up = ("lora_down.weight", "lora_up.weight")

    def larry(path: Path) -> Path:
        return _write(path, {**_lora_tensors(block_modules, 8, generator, dtype=torch.bfloat16),
                             **_lora_tensors(adaln, 2, generator, dtype=torch.bfloat16)})

    def comfyui(path: Path) -> Path:
        return _write(path, _lora_tensors(block_modules, 8, generator, prefix="diffusion_model.", factors=down_up,
                                          dtype=torch.bfloat16, alpha=2.0))

    def kohya(path: Path) -> Path:
        chosen = [*block_modules, *adaln, "time_embedder.proj_in", "final_layer.video_out"]
        stems = {"lora_unet_" + name.replace(".", "_"): vocabulary[name] for name in chosen}
        return _write(path, _lora_tensors(stems, 4, generator, factors=down_up, alpha=1.5),
                      {"ss_network_alpha": "1.5", "ss_network_dim": "4", "ss_network_module": "networks.lora"})

    def diffsynth(path: Path) -> Path:
        # random rows: any order is a valid interleaved layout
        return _write(path, _lora_tensors(block_modules, 4, generator,
                                          factors=("lora_A.default.weight", "lora_B.default.weight")))

    return {
        "native_larry_mixed_rank.safetensors": larry,
        "native_comfyui_alpha.safetensors": comfyui,
        "kohya_musubi.safetensors": kohya,
        "diffsynth_interleaved.safetensors": diffsynth,
    }


def _diffusers_files(shapes: TransformerShapes, generator: torch.Generator) -> dict[str, Callable[[Path], Path]]:
    every = {t: (shapes[t].out_features, shapes[t].in_features) for t in shapes.linears}
    turbo = {t: dims for t, dims in every.items() if t.endswith(BLOCK_LINEARS)}

    def peft_metadata(path: Path) -> Path:
        tensors = _lora_tensors(every, 4, generator, prefix="transformer.")
        config = {"r": 4, "lora_alpha": 2, "alpha_pattern": {"^norm_out.linear": 1}, "rank_pattern": {},
                  "target_modules": sorted(shapes.linears), "use_rslora": False, "use_dora": False, "lora_bias": False}
        metadata = {"format": "pt", "lora_adapter_metadata": json.dumps({f"transformer.{k}": v for k, v in config.items()}, sort_keys=True)}
        return _write(path, tensors, metadata)

    def lightx2v(path: Path) -> Path:
        # rank 128 like the real Turbo file: at alpha = rank it is 16x stronger than at its intended alpha 8
        return _write(path, _lora_tensors(turbo, LIGHTX2V_DEMO_RANK, generator, dtype=torch.bfloat16,
                                          factors=("lora_A.default.weight", "lora_B.default.weight")))

    def peft_rslora(path: Path) -> Path:
        written = _write(path, _lora_tensors(turbo, 4, generator, prefix="base_model.model."))
        targets = [name.removeprefix("attn.") for name in BLOCK_LINEARS]  # as PEFT names them: to_q … ff.net.2
        config = {"peft_type": "LORA", "r": 4, "lora_alpha": 4, "use_rslora": True, "alpha_pattern": {targets[-1]: 2},
                  "rank_pattern": {}, "target_modules": targets}
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
    parser = argparse.ArgumentParser(prog="python -m h3app.model.tiny_training.demo_adapters", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="folder to write the demo adapters into (e.g. assets/adapters)")
    args = parser.parse_args(argv)
    for path in write_demo_adapters(args.out_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
