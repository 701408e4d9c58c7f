"""LoRA for training: forward hooks that add ``(alpha / r) · B(A(x))`` to chosen ``nn.Linear`` outputs, and the two
file layouts the demo adapters are written in."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from ...rules.h3_modules import is_block_linear


def write_canonical(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> Path:
    """Save ``tensors`` (sorted) with a canonical header: safetensors writes ``__metadata__`` in hash order, which
    would make the bytes differ from run to run; the JSON is re-serialised with sorted keys (offsets unchanged)."""
    from safetensors.torch import save

    raw = save({k: tensors[k].contiguous() for k in sorted(tensors)}, metadata=metadata)
    header_len = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + header_len])
    canonical = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    canonical += b" " * (-len(canonical) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(canonical)) + canonical + raw[8 + header_len :])
    return path




def target_names(transformer: torch.nn.Module) -> list[str]:
    """The attention and FFN projections of every block and refiner block (LightX2V's Turbo targets)."""
    return sorted(name for name, module in transformer.named_modules()
                  if isinstance(module, torch.nn.Linear) and is_block_linear(name))


class TrainingLora:
    """Rank-``rank`` factors per target; ``A [r, in]`` seeded, ``B [out, r]`` zero (so training starts at the base)."""

    def __init__(self, transformer: torch.nn.Module, rank: int, alpha: float, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.rank, self.alpha = rank, alpha
        self.scale = alpha / rank
        self.factors: dict[str, tuple[torch.nn.Parameter, torch.nn.Parameter]] = {}
        self._handles = []
        modules = dict(transformer.named_modules())
        for name in target_names(transformer):
            linear = modules[name]
            down = torch.randn(rank, linear.in_features, generator=generator) / linear.in_features ** 0.5
            up = torch.zeros(linear.out_features, rank)
            self.factors[name] = (torch.nn.Parameter(down), torch.nn.Parameter(up))
            self._handles.append(linear.register_forward_hook(self._hook(name)))

    def _hook(self, name: str):
        def add_delta(module, inputs, output):
            down, up = self.factors[name]
            return output + self.scale * torch.nn.functional.linear(torch.nn.functional.linear(inputs[0], down), up)

        return add_delta

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for pair in self.factors.values() for p in pair]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def write_turbo(lora: TrainingLora, path: Path) -> Path:
    """LightX2V's Turbo layout: diffusers module names, PEFT ``lora_A/lora_B.default`` keys, no alpha anywhere."""
    tensors = {}
    for name, (down, up) in lora.factors.items():
        tensors[f"{name}.lora_A.default.weight"] = down.detach().clone()
        tensors[f"{name}.lora_B.default.weight"] = up.detach().clone()
    return write_canonical(path, tensors)


def write_with_alpha(lora: TrainingLora, path: Path) -> Path:
    """diffusers' PEFT layout (``transformer.`` prefix) with ``r``/``lora_alpha`` in ``lora_adapter_metadata``."""
    tensors = {}
    for name, (down, up) in lora.factors.items():
        tensors[f"transformer.{name}.lora_A.weight"] = down.detach().clone()
        tensors[f"transformer.{name}.lora_B.weight"] = up.detach().clone()
    config = {"r": lora.rank, "lora_alpha": lora.alpha, "target_modules": sorted(lora.factors), "use_rslora": False,
              "use_dora": False, "lora_bias": False}
    metadata = {"format": "pt", "lora_adapter_metadata": json.dumps({f"transformer.{k}": v for k, v in config.items()},
                                                                      sort_keys=True)}
    return write_canonical(path, tensors, metadata)
