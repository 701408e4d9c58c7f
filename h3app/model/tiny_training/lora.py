"""The demo LoRAs while they train, and the two file layouts they are written in.

Training runs through the project's own LoRA layer, the one the app applies the written files with: each target
Linear is wrapped in ``h3app.lora.LoRALinear`` (bound by the engine's ``BoundLayers``) carrying one ``LoRAFactors``
entry whose scale is the shared ``ScaleEntry`` of the one formula (``h3app.rules.scale.effective_scale``:
``alpha / rank`` here). The factors are the trained parameters themselves, so gradients flow into them.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ...lora.bound import BoundLayers
from ...lora.layers import LoRAFactors
from ...lora.pristine import PristineStore
from ...lora.scaling import AdapterScale, ModuleAlpha
from ...rules.choices import UNMERGED
from ...rules.h3_modules import group_of, is_block_linear


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


Factors = dict[str, tuple[torch.nn.Parameter, torch.nn.Parameter]]


@dataclass
class TrainingLora:
    """One adapter being trained: rank, alpha and fp32 factors per target (``A [r, in]``, ``B [out, r]``)."""

    rank: int
    alpha: float
    factors: Factors

    NAME = "training"  # the adapter's name on the wrappers while bound

    @classmethod
    def start(cls, transformer: torch.nn.Module, rank: int, alpha: float, seed: int) -> TrainingLora:
        """``A`` seeded (``N(0, 1/in)``), ``B`` zero, so training starts at the base; targets: ``target_names``."""
        generator = torch.Generator().manual_seed(seed)
        factors: Factors = {}
        for name in target_names(transformer):
            linear = transformer.get_submodule(name)
            assert isinstance(linear, torch.nn.Linear)  # target_names picks Linears only
            down = torch.randn(rank, linear.in_features, generator=generator) / linear.in_features ** 0.5
            up = torch.zeros(linear.out_features, rank)
            factors[name] = (torch.nn.Parameter(down), torch.nn.Parameter(up))
        return cls(rank, alpha, factors)

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for pair in self.factors.values() for p in pair]

    @contextmanager
    def bound(self, transformer: torch.nn.Module) -> Iterator[None]:
        """While inside, every target runs ``base(x) + scale · (x Aᵀ) Bᵀ`` through a ``LoRALinear`` (unmerged, the
        scale from ``rules/scale.py`` via ``AdapterScale``); on exit the original Linears are back in place."""
        stored = ModuleAlpha(float(self.alpha), int(self.rank))
        scale = AdapterScale((stored,), alpha=None, strength=1.0, group_strengths={})
        layers = BoundLayers(transformer, PristineStore())
        paths = sorted(self.factors)

        def attach() -> None:
            for path in paths:
                down, up = self.factors[path]
                entry = scale.entry_for(group_of(path), (stored,), down.device)
                layers.binding(path).wrapper.add_entry(LoRAFactors(self.NAME, entry, down, up))

        def detach() -> None:
            for path in paths:
                layers.binding(path).wrapper.remove_adapter(self.NAME)

        layers.transaction(paths, attach, mode=UNMERGED)
        try:
            yield
        finally:
            layers.transaction(paths, detach, mode=UNMERGED)

    def save(self, path: Path) -> None:
        """The work folder's copy of a finished stage (``torch.save``: rank, alpha, factors)."""
        torch.save({"rank": self.rank, "alpha": self.alpha,
                    "factors": {k: (a.detach(), b.detach()) for k, (a, b) in self.factors.items()}}, path)

    @classmethod
    def load(cls, path: Path) -> TrainingLora:
        saved = torch.load(path)
        factors = {k: (torch.nn.Parameter(a), torch.nn.Parameter(b)) for k, (a, b) in saved["factors"].items()}
        return cls(saved["rank"], saved["alpha"], factors)


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
