"""Helpers shared by the tests/test_adapters_*.py files: synthetic adapter files, ΔW, the diffusers oracle.

Nothing here is a test; every file is built in code (tiny tensors) and written to a tmp_path.
"""

from __future__ import annotations

import json
import math
import struct
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from h3app.adapters.types import HeaderView, ModuleLoRA
from h3app.rules.h3_modules import transformer_shapes

# The tiny checkpoint's transformer (common.md) and a twin with 128-wide heads, for the DiffSynth oracle which
# hard-codes head_dim 128.
TINY_CONFIG: dict[str, Any] = dict(
    num_attention_heads=2, attention_head_dim=16, hidden_size=24, num_layers=2, num_refiner_layers=2, ffn_dim=32,
    in_channels=4, audio_in_channels=8, patch_size=(1, 2, 2), text_dim=8, freq_dim=8, time_embed_hidden_dim=24,
    time_embed_dim=16, rope_freq_dim=2,
)
TINY_128_CONFIG: dict[str, Any] = {**TINY_CONFIG, "attention_head_dim": 128}
TINY_SHAPES = transformer_shapes(TINY_CONFIG)
TINY_128_SHAPES = transformer_shapes(TINY_128_CONFIG)

_DTYPE_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64", torch.int8: "I8",
                torch.int64: "I64"}
_DTYPE_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8}


def factors(out_features: int, in_features: int, rank: int, seed: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Random lora_A ``[rank, in]`` and lora_B ``[out, rank]`` (seeded)."""
    generator = torch.Generator().manual_seed(seed)
    down = torch.randn(rank, in_features, generator=generator)
    up = torch.randn(out_features, rank, generator=generator)
    return down.to(dtype), up.to(dtype)


def save(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=dict(metadata) if metadata else None)
    return path


def lora_keys(stem: str, down: torch.Tensor, up: torch.Tensor, style: str = "ab", slot: str | None = None) -> dict[str, torch.Tensor]:
    """The two factor keys of ``stem`` in a suffix style: "ab" (lora_A/B) or "du" (lora_down/up)."""
    infix = f".{slot}" if slot else ""
    if style == "ab":
        return {f"{stem}.lora_A{infix}.weight": down, f"{stem}.lora_B{infix}.weight": up}
    return {f"{stem}.lora_down.weight": down, f"{stem}.lora_up.weight": up}


def delta(module: ModuleLoRA, strength: float = 1.0) -> torch.Tensor:
    """h3app's ΔW ``[out, in]`` for a normalised module, in float64: alpha × strength / rank (rsLoRA √rank) · B @ A."""
    rank = module.rank
    scale = module.alpha * strength / (math.sqrt(rank) if module.use_rslora else rank)
    return scale * (module.up.double() @ module.down.double())


def relative_error(got: torch.Tensor, reference: torch.Tensor) -> float:
    return float((got.double() - reference.double()).abs().max() / reference.double().abs().max())


def call_with_timeout(function: Callable[[], Any], seconds: float = 120.0) -> Any:
    """Run a third-party call in a thread; fail the test if it does not return in time (the H3 converter loops
    forever on a negative ``.alpha``)."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = function()
        except BaseException as error:  # re-raised in the caller's thread
            result["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"oracle call did not return within {seconds} s")
    if "error" in result:
        raise result["error"]
    return result.get("value")


def oracle_deltas_diffusers(
    source: Path | Mapping[str, torch.Tensor], config: Mapping[str, Any] = TINY_CONFIG, prefix: str = "transformer"
) -> dict[str, torch.Tensor]:
    """diffusers' own path: ``MiniMaxH3LoraLoaderMixin.lora_state_dict`` (which runs
    ``_convert_non_diffusers_minimax_h3_lora_to_diffusers`` where needed), ``load_lora_adapter`` on a fresh unfused
    fp32 transformer, then PEFT's ``get_delta_weight`` per LoRA layer."""
    from diffusers import MiniMaxH3Transformer3DModel
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    def run() -> dict[str, torch.Tensor]:
        argument = str(source) if isinstance(source, Path) else dict(source)
        state_dict, metadata = MiniMaxH3LoraLoaderMixin.lora_state_dict(argument, return_lora_metadata=True)
        model = MiniMaxH3Transformer3DModel(**config)
        model.load_lora_adapter(state_dict, prefix=prefix, metadata=metadata, adapter_name="oracle")
        return _peft_deltas(model, "oracle")

    return call_with_timeout(run)


def oracle_deltas_peft(folder: Path, config: Mapping[str, Any] = TINY_CONFIG, strip: str = "base_model.model.") -> dict[str, torch.Tensor]:
    """PEFT's own path for a folder with ``adapter_config.json``: ``LoraConfig.from_pretrained``, inject, load."""
    from diffusers import MiniMaxH3Transformer3DModel
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict
    from safetensors.torch import load_file

    def run() -> dict[str, torch.Tensor]:
        model = MiniMaxH3Transformer3DModel(**config)
        lora_config = LoraConfig.from_pretrained(str(folder))
        inject_adapter_in_model(lora_config, model, adapter_name="peft")
        state = {k.removeprefix(strip): v for k, v in load_file(str(folder / "adapter_model.safetensors")).items()}
        result = set_peft_model_state_dict(model, state, adapter_name="peft")
        unexpected = [k for k in result.unexpected_keys if "lora" in k]
        assert not unexpected, unexpected
        return _peft_deltas(model, "peft")

    return call_with_timeout(run)


def _peft_deltas(model: torch.nn.Module, adapter_name: str) -> dict[str, torch.Tensor]:
    from peft.tuners.lora import LoraLayer

    with torch.no_grad():
        return {
            name: module.get_delta_weight(adapter_name).detach().double()
            for name, module in model.named_modules()
            if isinstance(module, LoraLayer) and adapter_name in module.lora_A
        }


def write_sparse_safetensors(
    path: Path,
    entries: Mapping[str, tuple[str, tuple[int, ...]]],
    scalars: Mapping[str, float] | None = None,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """A valid safetensors file whose big tensors are holes (never written): header, then the F32 scalars, then
    ``truncate`` to the full length. ``entries`` maps key → (dtype, shape)."""
    scalars = dict(scalars or {})
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    cursor = 0
    scalar_bytes = b""
    for key, value in scalars.items():
        header[key] = {"dtype": "F32", "shape": [], "data_offsets": [cursor, cursor + 4]}
        scalar_bytes += struct.pack("<f", value)
        cursor += 4
    for key, (dtype, shape) in entries.items():
        size = math.prod(shape) * _DTYPE_BYTES[dtype]
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [cursor, cursor + size]}
        cursor += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        handle.write(scalar_bytes)
        handle.truncate(8 + len(raw) + cursor)
    return path


def lightx2v_full_size_entries(rank: int = 128) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The 624 keys of LightX2V's rank-128 H3 Turbo (diffusers names, ``.default.`` slot, BF16), full size."""
    from h3app.rules.h3_modules import FULL_SIZE_CONFIG

    shapes = transformer_shapes(FULL_SIZE_CONFIG)
    six = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")
    entries: dict[str, tuple[str, tuple[int, ...]]] = {}
    for target, linear in shapes.linears.items():
        if target.endswith(six):
            entries[f"{target}.lora_A.default.weight"] = ("BF16", (rank, linear.in_features))
            entries[f"{target}.lora_B.default.weight"] = ("BF16", (linear.out_features, rank))
    return entries


def larry_full_size_entries() -> dict[str, tuple[str, tuple[int, ...]]]:
    """A Larry-shaped native file at full size: rank 64 on attention/FFN, 16 on AdaLN, bare names, BF16."""
    from h3app.adapters.formats import native_vocabulary
    from h3app.rules.h3_modules import FULL_SIZE_CONFIG

    vocabulary = native_vocabulary(transformer_shapes(FULL_SIZE_CONFIG))
    entries: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, (out_features, in_features) in vocabulary.items():
        if not name.startswith(("blocks.", "token_refiner.", "final_layer.adaln")):
            continue
        rank = 16 if "adaln" in name else 64
        entries[f"{name}.lora_A.weight"] = ("BF16", (rank, in_features))
        entries[f"{name}.lora_B.weight"] = ("BF16", (out_features, rank))
    return entries


def header_view(
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None = None,
    adapter_config: Mapping[str, Any] | None = None,
    name: str = "adapter.safetensors",
) -> HeaderView:
    """A ``HeaderView`` of an in-memory state dict (what ``read_local_header`` returns for it once saved)."""
    return HeaderView(
        tensors={k: (_DTYPE_NAMES[v.dtype], tuple(v.shape)) for k, v in tensors.items()},
        metadata=dict(metadata or {}),
        scalars={k: float(v.item()) for k, v in tensors.items() if v.dim() == 0},
        adapter_config=dict(adapter_config) if adapter_config is not None else None,
        file_bytes=sum(v.numel() * v.element_size() for v in tensors.values()),
        name=name,
    )


def native_block(prefix: str = "", index: int = 0, rank: int = 4, style: str = "ab", slot: str | None = None,
                 seed: int = 0, shapes=TINY_SHAPES, modules: tuple[str, ...] = ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2", "adaln_proj.linear"),
                 refiner: bool = False) -> dict[str, torch.Tensor]:
    """Native-named factors for one (main or refiner) block of ``shapes``."""
    from h3app.adapters.formats import native_vocabulary

    vocabulary = native_vocabulary(shapes)
    block = f"token_refiner.blocks.{index}" if refiner else f"blocks.{index}"
    tensors: dict[str, torch.Tensor] = {}
    for offset, module in enumerate(modules):
        name = f"{block}.{module}"
        if name not in vocabulary:
            continue
        down, up = factors(*vocabulary[name], rank, seed=seed * 100 + offset)
        tensors.update(lora_keys(prefix + name, down, up, style, slot))
    return tensors


def diffusers_targets(prefix: str = "", targets: tuple[str, ...] | None = None, rank: int = 4, slot: str | None = None,
                      seed: int = 0, shapes=TINY_SHAPES) -> dict[str, torch.Tensor]:
    """diffusers-named factors for ``targets`` (default: every Linear of ``shapes``)."""
    tensors: dict[str, torch.Tensor] = {}
    for offset, target in enumerate(targets or tuple(shapes.linears)):
        linear = shapes[target]
        down, up = factors(linear.out_features, linear.in_features, rank, seed=seed * 1000 + offset)
        tensors.update(lora_keys(prefix + target, down, up, "ab", slot))
    return tensors


def kohya_block(index: int = 0, rank: int = 4, alpha: float | None = None, seed: int = 0,
                modules: tuple[str, ...] = ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2", "adaln_proj.linear"),
                shapes=TINY_SHAPES) -> dict[str, torch.Tensor]:
    """musubi-style factors for one main block: ``lora_unet_`` + flattened native names, lora_down/up, ``.alpha``."""
    from h3app.adapters.formats import native_vocabulary

    vocabulary = native_vocabulary(shapes)
    tensors: dict[str, torch.Tensor] = {}
    for offset, module in enumerate(modules):
        name = f"blocks.{index}.{module}"
        stem = "lora_unet_" + name.replace(".", "_")
        tensors.update(lora_keys(stem, *factors(*vocabulary[name], rank, seed=seed * 100 + offset), "du"))
        if alpha is not None:
            tensors[f"{stem}.alpha"] = torch.tensor(alpha)
    return tensors


def forbid_tensor_loads(monkeypatch: Any) -> None:
    """Make ``safetensors.safe_open`` header-only for the rest of the test: reading any tensor fails it."""
    import safetensors

    real = safetensors.safe_open

    class HeaderOnly:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._inner = real(*args, **kwargs)

        def __enter__(self) -> HeaderOnly:
            self._handle = self._inner.__enter__()
            return self

        def __exit__(self, *exc: Any) -> Any:
            return self._inner.__exit__(*exc)

        def keys(self) -> Any:
            return self._handle.keys()

        def get_slice(self, key: str) -> Any:
            return self._handle.get_slice(key)

        def get_tensor(self, key: str) -> Any:
            raise AssertionError(f"tensor {key} was loaded during a header-only read")

    monkeypatch.setattr(safetensors, "safe_open", HeaderOnly)
