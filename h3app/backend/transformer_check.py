"""Transformer-mode equivalence check: one forward of the transformer on a fixed seeded packed input under setting A,
A again (the control), B, and the old fallback (alpha = rank, strength 1); sha256 over the raw fp32 outputs (video
velocity bytes, then audio velocity bytes). The packed input layout is documented in docs/lora-engine.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..rules.alpha_source import AlphaSource
from ..rules.check_pair import CheckSetting
from ..rules.choices import TRANSFORMER_CHECK, UNMERGED
from ..rules.request_defaults import SEED

if TYPE_CHECKING:
    import torch

    from ..adapters.types import NormalisedAdapter
    from ..settings import LoRASettings

CHECK_ADAPTER_NAME = "check"

# The packed check input (docs/lora-engine.md): rows of each modality and the order they are packed in.
TEXT_ROWS = 4
AUDIO_STEPS = 3  # per channel; stereo → 2 × 3 = 6 audio rows, channel-major
AUDIO_CHANNELS = 2
VIDEO_FRAMES, VIDEO_HEIGHT, VIDEO_WIDTH = 2, 2, 2  # latent patch grid → 8 video rows
TIMESTEPS = (0.7, 0.3)  # text and video rows use 0.7, audio rows 0.3


def packed_check_input(config: Mapping[str, Any], seed: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The fixed packed input of check mode, as keyword arguments of ``MiniMaxH3Transformer3DModel.forward``.

    Sequence (18 rows): 4 text rows | 6 audio rows (2 channels × 3 steps, channel-major) | 8 video rows (2 latent
    frames × 2 × 2 patches). Token tags: text 1, audio 2, video 0. ``timestep = [0.7, 0.3]``: text and video rows
    use index 0, audio rows index 1. Positions (t, h, w): text ``(i, 0, 0)``; audio ``(4 + k, 0, c)`` for step k of
    channel c; video ``(4 + f, y, x)``. Latent values are standard normal from a CPU ``torch.Generator`` seeded with
    ``seed`` (drawn in the order video, audio, text; fp32), then moved to ``device``; the model casts them.
    """
    import torch

    patch = config.get("patch_size", (1, 2, 2))
    video_width = int(config.get("in_channels", 24)) * int(patch[0]) * int(patch[1]) * int(patch[2])
    audio_width = int(config.get("audio_in_channels", 32))
    text_width = int(config.get("text_dim", 5120))
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    video_rows = VIDEO_FRAMES * VIDEO_HEIGHT * VIDEO_WIDTH
    audio_rows = AUDIO_CHANNELS * AUDIO_STEPS
    video = torch.randn(1, video_rows, video_width, generator=generator, dtype=torch.float32)
    audio = torch.randn(1, audio_rows, audio_width, generator=generator, dtype=torch.float32)
    text = torch.randn(1, TEXT_ROWS, text_width, generator=generator, dtype=torch.float32)

    text_idx = torch.arange(0, TEXT_ROWS)
    audio_idx = torch.arange(TEXT_ROWS, TEXT_ROWS + audio_rows)
    video_idx = torch.arange(TEXT_ROWS + audio_rows, TEXT_ROWS + audio_rows + video_rows)
    length = TEXT_ROWS + audio_rows + video_rows
    tags = torch.empty(length, dtype=torch.long)
    tags[text_idx], tags[audio_idx], tags[video_idx] = 1, 2, 0
    timestep_indices = torch.zeros(length, dtype=torch.long)
    timestep_indices[audio_idx] = 1
    positions = torch.zeros(length, 3, dtype=torch.float32)
    positions[text_idx, 0] = torch.arange(TEXT_ROWS, dtype=torch.float32)
    for channel in range(AUDIO_CHANNELS):
        rows = audio_idx[channel * AUDIO_STEPS:(channel + 1) * AUDIO_STEPS]
        positions[rows, 0] = TEXT_ROWS + torch.arange(AUDIO_STEPS, dtype=torch.float32)
        positions[rows, 2] = float(channel)
    grid = torch.stack(torch.meshgrid(torch.arange(VIDEO_FRAMES), torch.arange(VIDEO_HEIGHT),
                                      torch.arange(VIDEO_WIDTH), indexing="ij"), dim=-1).reshape(-1, 3).float()
    grid[:, 0] += TEXT_ROWS
    positions[video_idx] = grid
    tensors = {
        "hidden_states": video,
        "audio_hidden_states": audio,
        "encoder_hidden_states": text,
        "timestep": torch.tensor(TIMESTEPS, dtype=torch.float32),
        "timestep_indices": timestep_indices,
        "token_tags": tags,
        "position_ids": positions,
        "video_indices": video_idx,
        "audio_indices": audio_idx,
        "text_indices": text_idx,
    }
    return {name: tensor.to(device) for name, tensor in tensors.items()}


def output_bytes(output: Any) -> tuple[bytes, torch.Tensor, torch.Tensor]:
    """Raw fp32 bytes of (video velocity, then audio velocity), and the two fp32 CPU tensors."""
    import torch

    video, audio = (output.sample, output.audio_sample) if hasattr(output, "sample") else output
    video = video.detach().to("cpu", torch.float32).contiguous()
    audio = audio.detach().to("cpu", torch.float32).contiguous()
    return video.numpy().tobytes() + audio.numpy().tobytes(), video, audio


def _max_abs_diff(x: Sequence[torch.Tensor], y: Sequence[torch.Tensor]) -> float:
    """The largest ``|p - q|`` over paired tensors (video and audio outputs), in float64."""
    return max(float((p.double() - q.double()).abs().max()) if p.numel() else 0.0 for p, q in zip(x, y))


def summarise_scales(scales: Mapping[str, float], ranks: Mapping[str, int]) -> float | dict[str, float]:
    """One number when every module runs at the same scale; else one per rank (``{"64": …, "16": …}``) when that
    is unambiguous; else one per target."""
    values = set(scales.values())
    if len(values) == 1:
        return values.pop()
    per_rank: dict[str, set[float]] = {}
    for target, scale in scales.items():
        per_rank.setdefault(str(ranks[target]), set()).add(scale)
    if all(len(v) == 1 for v in per_rank.values()):
        return {rank: next(iter(v)) for rank, v in sorted(per_rank.items(), key=lambda kv: -int(kv[0]))}
    return dict(scales)


def with_rank_alpha(adapter: NormalisedAdapter) -> NormalisedAdapter:
    """The same adapter as the old loaders saw it: every module at alpha = rank, no rsLoRA (scale = strength)."""
    modules = {target: dataclasses.replace(m, alpha=float(m.rank), alpha_source=AlphaSource.RANK_FALLBACK, use_rslora=False)
               for target, m in adapter.modules.items()}
    return dataclasses.replace(adapter, modules=modules)


def run_transformer_check(transformer: torch.nn.Module, adapter: NormalisedAdapter, *, a: CheckSetting,
                          b: CheckSetting, seed: int = SEED, source: str = "", low_rank_only: bool = False,
                          advanced: LoRASettings | None = None) -> dict[str, Any]:
    """Transformer-mode check on an adapter-free ``transformer`` (left adapter-free afterwards).

    Runs with ``torch.use_deterministic_algorithms(True)``, unmerged, in the attention backend the transformer was
    loaded with (``model.attention.in_use``; diffusers' ``native`` SDPA where none was set). Returns the ``check --json`` object (docs/architecture.md) plus context fields. ``low_rank_only``: B rescales
    only the low-rank parts (its exact deltas stay at A's strength: ``adapters.parts.check_note``). ``advanced``:
    settings whose per-modality and block strengths every column runs at (its schedule applies per evaluation of a
    generation, not to this one forward: a warning says so).
    """
    import torch

    from ..adapters.parts import check_note
    from ..lora.engine import LoRAEngine
    from ..model.attention import in_use
    from ..model.loader import config_of

    base = _check_settings(advanced, source or adapter.identity or "adapter")
    started = time.perf_counter()
    device = next(transformer.parameters()).device
    inputs = packed_check_input(config_of(transformer), seed, device)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    engine = LoRAEngine(transformer)

    def forward() -> tuple[bytes, torch.Tensor, torch.Tensor]:
        with torch.no_grad(), _fixed_attention_backend():
            return output_bytes(transformer(**inputs, return_dict=True))

    ranks = {t: m.rank for t, m in adapter.modules.items()}
    try:
        report = engine.attach(adapter, dataclasses.replace(base, alpha=a.alpha, strength=a.strength),
                               CHECK_ADAPTER_NAME)
        bytes_a, *out_a = forward()
        bytes_control, *_ = forward()
        scales_a = engine.effective_scales(CHECK_ADAPTER_NAME)
        engine.set_lora(CHECK_ADAPTER_NAME, alpha=b.alpha, strength=b.strength,
                        exact_strength=a.strength if low_rank_only else None)
        bytes_b, *out_b = forward()
        scales_b = engine.effective_scales(CHECK_ADAPTER_NAME)
        engine.detach()
        engine.attach(with_rank_alpha(adapter), dataclasses.replace(base, alpha=None, strength=1.0),
                      CHECK_ADAPTER_NAME)
        bytes_fallback, *out_fallback = forward()
    finally:
        engine.detach()
        torch.use_deterministic_algorithms(was_deterministic)

    matched_ranks = {m.target: m.rank for m in report.matched}
    return {
        "identical": bytes_a == bytes_b,
        "hash_a": _sha(bytes_a),
        "hash_b": _sha(bytes_b),
        "hash_fallback": _sha(bytes_fallback),
        "max_abs_diff": _max_abs_diff(tuple(out_a), tuple(out_b)),
        "fallback_max_abs_diff": _max_abs_diff(tuple(out_fallback), tuple(out_a)),
        "control_identical": bytes_a == bytes_control,
        "effective_scale_a": summarise_scales(scales_a, ranks),
        "effective_scale_b": summarise_scales(scales_b, ranks),
        "mode": TRANSFORMER_CHECK,
        "seconds": round(time.perf_counter() - started, 3),
        "a": a.label,
        "b": b.label,
        "seed": seed,
        "adapter": source or adapter.identity,
        "matched": len(report.matched),
        "ranks": sorted(set(matched_ranks.values()), reverse=True),
        "lora_mode": UNMERGED,
        "device": str(device),
        "dtype": str(next(transformer.parameters()).dtype).replace("torch.", ""),
        "deterministic": True,
        "attention_backend": in_use(transformer).dispatcher,  # diffusers' name of the backend set at load
        "warnings": _check_warnings(report, base),
        "parts": dict(adapter.info.parts),
        "low_rank_only": low_rank_only,
        "parts_note": check_note(adapter.info.parts, a.strength, b.strength, low_rank_only),
        "not_applied": _not_applied(adapter, source),
        "finite": all(math.isfinite(float(t.abs().max())) for t in (*out_a, *out_b) if t.numel()),
    }


def _not_applied(adapter: NormalisedAdapter, source: str | None) -> list[str]:
    """The line naming the keys of the file the check left out (``check --json``'s ``not_applied``, as generate's)."""
    from ..adapters.summary import not_applied_lines

    return not_applied_lines([{"source": source or adapter.identity, "not_applied": adapter.info.not_applied.to_json()}])


def _sha(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _check_settings(advanced: LoRASettings | None, source: str) -> LoRASettings:
    """The settings every column starts from: ``advanced``'s per-modality, schedule and block strengths, unmerged."""
    from ..settings import LoRASettings

    return dataclasses.replace(advanced or LoRASettings(source=source), mode=UNMERGED, source=source)


def _check_warnings(report: Any, settings: LoRASettings) -> list[str]:
    """The attach report's warnings, and what one forward outside a generation does not run."""
    per_evaluation = "applies per evaluation inside a generation; this one forward runs"
    return list(report.warnings) + (
        [f"the head bank {per_evaluation} the original heads (use --mode full)"] if report.head_banks else []) + (
        [f"the strength schedule {per_evaluation} at factor 1 (use --mode full)"] if settings.schedule else [])


def _fixed_attention_backend():
    """diffusers' ``native`` (torch SDPA) backend for the processors that did not pick one explicitly."""
    from diffusers.models.attention_dispatch import attention_backend

    return attention_backend("native")
