"""Tiny transformers and synthetic normalised adapters for the LoRA engine tests (no files, no loader)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import torch

from h3app.adapters.types import AdapterInfo, ModuleLoRA, NormalisedAdapter
from h3app.lora.layers import LoRALinear
from h3app.model.loader import fuse_qkv as fuse  # the loader's own fusing, freeing the split weights
from h3app.rules.h3_modules import BLOCK_LINEARS as LIGHTX2V_SUFFIXES

TINY_CONFIG = dict(
    num_attention_heads=2, attention_head_dim=16, hidden_size=24, num_layers=2, num_refiner_layers=2, ffn_dim=32,
    in_channels=4, audio_in_channels=8, patch_size=(1, 2, 2), text_dim=8, freq_dim=8, time_embed_hidden_dim=24,
    time_embed_dim=16, rope_freq_dim=2,
)


def build_tiny(seed: int = 0, *, fused: bool = False, **overrides) -> torch.nn.Module:
    """The tiny H3 transformer (fp32, seeded init, eval). ``fused`` fuses q/k/v and frees the split weights, as the
    loader's ``fuse_qkv`` does."""
    from diffusers import MiniMaxH3Transformer3DModel

    torch.manual_seed(seed)
    model = MiniMaxH3Transformer3DModel(**{**TINY_CONFIG, **overrides}).eval().requires_grad_(False)
    # diffusers zero-initialises nothing here, but make every Linear clearly non-trivial (incl. biases).
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed + 1)
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.2)
                if module.bias is not None:
                    module.bias.copy_(torch.randn(module.bias.shape, generator=generator) * 0.05)
    if fused:
        fuse(model)
    return model


def linear_shapes(model: torch.nn.Module) -> dict[str, tuple[int, int]]:
    """Canonical (unfused) target → (out, in) from an *unfused* model."""
    return {name: (m.out_features, m.in_features) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def block_targets(shapes: Mapping[str, tuple[int, int]], suffixes: Sequence[str] = LIGHTX2V_SUFFIXES) -> list[str]:
    return [name for name in shapes if any(name.endswith("." + suffix) for suffix in suffixes)
            and (name.startswith("transformer_blocks.") or name.startswith("token_refiner."))]


def make_adapter(
    shapes: Mapping[str, tuple[int, int]],
    targets: Sequence[str],
    *,
    rank: int | Mapping[str, int] = 4,
    alpha: float | Mapping[str, float] | None = None,
    alpha_source: str | None = None,
    use_rslora: bool = False,
    seed: int = 0,
    magnitude: float = 0.3,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    shared_qkv_down: bool = False,
    unmatched_keys: Sequence[str] = (),
    identity: str = "synthetic",
) -> NormalisedAdapter:
    """A normalised adapter with random factors for ``targets`` (canonical names; shapes from ``shapes``).

    ``alpha=None`` means "no alpha stored": alpha = rank with source ``rank_fallback``. ``shared_qkv_down`` gives
    q/k/v of a block one shared ``A`` object (a native fused source split by the loader).
    """
    generator = torch.Generator().manual_seed(seed)
    modules: dict[str, ModuleLoRA] = {}
    shared: dict[str, torch.Tensor] = {}
    for target in targets:
        out_features, in_features = shapes[target]
        r = rank[target] if isinstance(rank, Mapping) else rank
        if device == "meta":
            down = torch.empty(r, in_features, dtype=dtype, device="meta")
            up = torch.empty(out_features, r, dtype=dtype, device="meta")
        else:
            down = (torch.randn(r, in_features, generator=generator) * magnitude).to(dtype)
            up = (torch.randn(out_features, r, generator=generator) * magnitude).to(dtype)
        if shared_qkv_down and target.rsplit(".", 1)[-1] in ("to_q", "to_k", "to_v"):
            key = target.rsplit(".", 1)[0]
            down = shared.setdefault(key, down)
        if alpha is None:
            a, source = float(r), alpha_source or "rank_fallback"
        else:
            a = float(alpha[target] if isinstance(alpha, Mapping) else alpha)
            source = alpha_source or "metadata"
        modules[target] = ModuleLoRA(target=target, down=down, up=up, alpha=a, alpha_source=source,
                                     use_rslora=use_rslora, source_keys=(f"{target}.lora_A.weight", f"{target}.lora_B.weight"))
    ranks = {t: m.rank for t, m in modules.items()}
    alphas = {t: m.alpha for t, m in modules.items()}
    info = AdapterInfo(
        format="peft", suffix_style="lora_A/B", prefix="", rank=next(iter(set(ranks.values()))) if len(set(ranks.values())) == 1 else None,
        ranks=ranks, alpha=next(iter(set(alphas.values()))) if len(set(alphas.values())) == 1 else None,
        alpha_source=next(iter({m.alpha_source for m in modules.values()})), alphas=alphas,
        alpha_sources={t: m.alpha_source for t, m in modules.items()}, num_targets=len(modules),
        targets=tuple(modules), dtype=str(dtype).replace("torch.", ""), file_bytes=0,
    )
    return NormalisedAdapter(info=info, modules=modules, unmatched_keys=tuple(unmatched_keys), identity=identity)


def state_hash(model: torch.nn.Module) -> str:
    """sha256 over every state_dict entry's name, dtype, shape and raw bytes."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def module_types(model: torch.nn.Module) -> list[tuple[str, str]]:
    return [(name, type(module).__name__) for name, module in model.named_modules()]


def forward(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        out = model(**inputs, return_dict=True)
    return out.sample.clone(), out.audio_sample.clone()


def same_bits(x: tuple[torch.Tensor, ...], y: tuple[torch.Tensor, ...]) -> bool:
    return all(torch.equal(p.view(torch.int32) if p.dtype == torch.float32 else p, q.view(torch.int32) if q.dtype == torch.float32 else q)
               for p, q in zip(x, y))


def max_rel_err(x: tuple[torch.Tensor, ...], ref: tuple[torch.Tensor, ...]) -> float:
    """max|x − ref| / max|ref| over the pair of outputs."""
    num = max(float((p - q).abs().max()) for p, q in zip(x, ref))
    den = max(float(q.abs().max()) for q in ref)
    return num / den


def fail_merge_at(monkeypatch, call: int, error: Exception) -> None:
    """Make the ``call``-th ``LoRALinear.merge_from`` from now on merge, then scramble its weight (a half-written
    weight) and raise ``error``: what a failure mid-merge leaves behind. Calling it again re-arms it, counting anew."""
    original = getattr(LoRALinear.merge_from, "__wrapped__", LoRALinear.merge_from)
    calls = 0

    def flaky(self, pristine, key):
        nonlocal calls
        calls += 1
        original(self, pristine, key)
        if calls == call:
            self.base.weight.data.mul_(3.0)
            raise error

    flaky.__wrapped__ = original
    monkeypatch.setattr(LoRALinear, "merge_from", flaky)


def assert_alpha_pair_bitwise(adapter: NormalisedAdapter, name: str) -> None:
    """alpha 8 / strength 1 and alpha 128 / strength 1/16 give the same forward bit for bit, unmerged and merged, on
    a fresh tiny transformer, and detach leaves its weights bitwise the base (the check's pair, for any kind)."""
    from h3app.backend.transformer_check import packed_check_input
    from h3app.lora.engine import LoRAEngine
    from h3app.settings import LoRASettings

    for mode in ("unmerged", "merged"):
        model = build_tiny()
        base = state_hash(model)
        engine = LoRAEngine(model)
        inputs = packed_check_input(model.config, 0)
        engine.attach(adapter, LoRASettings(source=name, alpha=8.0, strength=1.0, mode=mode), name)
        first = forward(model, inputs)
        engine.set_lora(name, alpha=128.0, strength=0.0625)
        assert same_bits(first, forward(model, inputs)), mode
        engine.detach()
        assert state_hash(model) == base, mode
