"""Export a normalised adapter as a clean diffusers/PEFT LoRA with the chosen alpha and strength baked in.

The file has keys ``<partition>.<diffusers module>.lora_A.weight`` ``[r, in]`` / ``.lora_B.weight`` ``[out, r]``
(fp32 unless asked otherwise), ``<partition>`` being ``transformer`` or ``transformer_ref``: diffusers' H3 loader
routes keys to the pipeline component their prefix names, so a ``transformer_ref`` export loads into
``transformer_ref`` without ``load_into_transformer_ref`` and the per-module effective scale ``s = alpha × strength / r`` (rsLoRA:
``/ √r``) stored as ``lora_alpha = s × r`` with ``use_rslora = false`` — the most common value as ``lora_alpha``,
the others in ``alpha_pattern`` (likewise ``r``/``rank_pattern``), patterns anchored with ``^`` as diffusers does.
The same LoraConfig goes into the header's ``lora_adapter_metadata`` (fields prefixed with the same partition, which
diffusers' ``load_lora_weights``/``load_lora_adapter`` read) and into ``adapter_config.json`` (which PEFT reads),
so either applies exactly h3app's ΔW = s · B @ A.

Per-block strength (``rules.blocks``) is baked too: a block's factor multiplies the scale of its modules. A strength
schedule (a factor per evaluation) and per-modality strength (a factor per token row) change the delta while the
model runs, which a plain LoRA file cannot express: export refuses them in one line.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import H3AppError
from ..rules.blocks import BlockStrength
from ..rules.scale import effective_scale
from ..settings import BLOCKS, LoRASettings, check_strength
from .formats import MAIN_PARTITION, PARTITIONS
from .kinds.base import dense_pair
from .parts import ADAPTER_KIND_WORDS
from .types import NormalisedAdapter

WEIGHTS_NAME = "adapter_model.safetensors"
CONFIG_NAME = "adapter_config.json"
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


@dataclass(frozen=True)
class ExportResult:
    """What was written: the two files, the LoraConfig fields, and the effective scale per target."""

    weights: Path
    config: Path
    num_targets: int
    strength: float
    lora_config: Mapping[str, Any]
    scales: Mapping[str, float] = field(default_factory=dict)
    dtype: str = "float32"
    partition: str = MAIN_PARTITION
    block_strength: str = ""  # the per-block factors baked in (canonical spelling; "" = none)
    note: str = ""  # how exact the file is for LoKr/LoHa/DoRA modules (``exported_factors``)

    def to_json(self) -> dict[str, Any]:
        return {
            "out": str(self.weights.parent),
            "weights": str(self.weights),
            "config": str(self.config),
            "num_targets": self.num_targets,
            "strength": self.strength,
            "dtype": self.dtype,
            "partition": self.partition,
            BLOCKS.name: self.block_strength,
            "r": self.lora_config["r"],
            "lora_alpha": self.lora_config["lora_alpha"],
            "rank_pattern": dict(self.lora_config["rank_pattern"]),
            "alpha_pattern": dict(self.lora_config["alpha_pattern"]),
            "effective_scales": dict(self.scales),
            "note": self.note,
        }


def parse_export_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise H3AppError(f"--dtype must be one of float32, bfloat16, float16, got {name!r}.") from None


def lora_config_for(adapter: NormalisedAdapter, strength: float, blocks: BlockStrength | None = None,
                    baked: Mapping[str, float] | None = None) -> tuple[dict[str, Any], dict[str, float]]:
    """The PEFT LoraConfig fields (unprefixed) that reproduce h3app's scale at ``strength`` (and ``blocks``' factor
    per main block), and the scales. The file's rank is each pair's width (a LoKr/LoHa pair may be wider than the
    rank its alpha is divided by); ``baked``: targets whose factors already hold their scaled ΔW (a DoRA at a fixed
    strength) and the width of their pair: scale 1."""
    blocks = blocks or BlockStrength()
    baked = baked or {}
    ranks = {target: int(baked.get(target) or module.width) for target, module in adapter.modules.items()}
    scales = {
        target: 1.0 if target in baked else effective_scale(module.alpha, strength, module.rank, module.use_rslora,
                                                            block_strength=blocks.factor_of(target))
        for target, module in adapter.modules.items()
    }
    alphas = {target: scales[target] * ranks[target] for target in adapter.modules}
    r = Counter(ranks.values()).most_common(1)[0][0]
    lora_alpha = Counter(alphas.values()).most_common(1)[0][0]
    config = {
        "r": r,
        "lora_alpha": lora_alpha,
        "rank_pattern": {f"^{t}": v for t, v in ranks.items() if v != r},
        "alpha_pattern": {f"^{t}": v for t, v in alphas.items() if v != lora_alpha},
        "target_modules": sorted(adapter.modules),
        "use_rslora": False,
        "use_dora": False,
        "lora_bias": False,
    }
    return config, scales


def export_adapter(
    adapter: NormalisedAdapter,
    out_dir: str | Path,
    *,
    strength: float = 1.0,
    dtype: torch.dtype = torch.float32,
    base_model: str | None = None,
    source: str | None = None,
    partition: str = MAIN_PARTITION,
    advanced: LoRASettings | None = None,
    base_weights: Mapping[str, torch.Tensor] | None = None,
) -> ExportResult:
    """Write ``adapter_model.safetensors`` and ``adapter_config.json`` into ``out_dir`` (created if needed).

    ``partition`` is the transformer ``adapter`` was loaded for (``load_adapter(partition=...)``); it prefixes every
    key and metadata field, so diffusers loads the file into that component. ``advanced``: settings whose block
    strengths are baked in (a schedule or per-modality strengths are refused). ``base_weights``: the model's
    ``<target>.weight`` for every DoRA target (``baked_targets``), whose rule is baked at ``strength``."""
    blocks, strength = _check_request(adapter, partition, strength, advanced)
    factors, note = exported_factors(adapter, strength, blocks, base_weights)
    config, scales = lora_config_for(adapter, strength, blocks,
                                     {t: float(f[0].shape[0]) for t, f in factors.items() if t in baked_targets(adapter)})
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise H3AppError(f"--out {out} exists and is not a folder: give a folder path.")
    out.mkdir(parents=True, exist_ok=True)

    tensors = {f"{partition}.{target}.lora_{ab}.weight": factor.to(dtype, copy=True).contiguous()
               for target in sorted(adapter.modules) for ab, factor in zip("AB", factors[target])}
    provenance = {
        "source": source or adapter.identity,
        "strength": strength,
        **({BLOCKS.name: blocks.label} if blocks.ranges else {}),
        "alphas": {t: m.alpha for t, m in adapter.modules.items()},
        "alpha_sources": {t: m.alpha_source for t, m in adapter.modules.items()},
        "use_rslora": {t: m.use_rslora for t, m in adapter.modules.items() if m.use_rslora},
    }
    metadata = {
        "format": "pt",
        "lora_adapter_metadata": json.dumps({f"{partition}.{k}": v for k, v in config.items()}, indent=2, sort_keys=True),
        "h3app_export": json.dumps(provenance, sort_keys=True),
    }
    from safetensors.torch import save_file

    weights = out / WEIGHTS_NAME
    save_file(tensors, str(weights), metadata=metadata)
    adapter_config = {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": base_model,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "lora_dropout": 0.0,
        **config,
    }
    config_path = out / CONFIG_NAME
    config_path.write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return ExportResult(
        weights=weights,
        config=config_path,
        num_targets=len(adapter.modules),
        strength=strength,
        lora_config=config,
        scales=scales,
        dtype=str(dtype).removeprefix("torch."),
        partition=partition,
        block_strength=blocks.label,
        note=note,
    )


def _check_request(adapter: NormalisedAdapter, partition: str, strength: float,
                   advanced: LoRASettings | None) -> tuple[BlockStrength, float]:
    """The block strengths to bake and the checked strength; refused in one line: an unknown partition, a zero
    strength, exact parts (a PEFT LoRA cannot hold them), nothing for this partition."""
    if partition not in PARTITIONS:
        raise H3AppError(f"partition must be one of {', '.join(PARTITIONS)}, got {partition!r}.")
    blocks = refuse_unbakeable(advanced)
    strength = check_strength(strength)
    if strength == 0:
        raise H3AppError("scale 0 would export an adapter that does nothing: give a non-zero --scale.")
    if adapter.has_exact_parts:
        parts = len(adapter.parts) + 2 * len(adapter.banks)
        raise H3AppError(f"the adapter carries {parts} exact parts (deltas, replacements or a head bank) that a PEFT "
                         "LoRA cannot hold: export writes A/B pairs only, so nothing was written; use the file as it is.")
    if not adapter.modules:
        raise H3AppError("the adapter has no modules for this partition: nothing to export.")
    return blocks, strength


def refuse_unbakeable(advanced: LoRASettings | None) -> BlockStrength:
    """The block strengths of ``advanced`` (baked into the export); a schedule or per-modality strengths are refused
    in one line: a plain LoRA file applies one scale per module, to every row and every evaluation."""
    if advanced is None:
        return BlockStrength()
    if advanced.schedule is not None:
        raise H3AppError(f"a strength schedule ({advanced.schedule.label}) changes the scale at every evaluation, "
                         "which a LoRA file cannot hold: export without it (the schedule stays an h3app setting).")
    if not advanced.modality.is_unit:
        raise H3AppError(f"per-modality strength ({advanced.modality.label}) scales each token row by its modality, "
                         "which a LoRA file cannot hold: export with every modality strength at 1.")
    return advanced.blocks


def baked_targets(adapter: NormalisedAdapter) -> list[str]:
    """The DoRA targets: exported as their ΔW at the chosen strength (needs the base weights)."""
    return sorted(t for t, m in adapter.modules.items() if m.magnitude is not None)


def exported_factors(adapter: NormalisedAdapter, strength: float, blocks: BlockStrength,
                     base_weights: Mapping[str, torch.Tensor] | None) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], str]:
    """``(target → (A, B) to write, the sentence saying how exact that is)``. Pairs, LoKr and LoHa pairs are written
    as they are (exact: a LoKr/LoHa pair's product is its ΔW); a DoRA becomes its ΔW at ``strength``,
    ``m ⊙ (W + sBA)/‖W + sBA‖_row − W`` (``h3app.lora.dora``), held full-rank (an identity and ΔW: no truncation),
    its error against the float64 rule measured and stated. No base weights for a DoRA: refused in one line."""
    factors = {t: (m.down, m.up) for t, m in adapter.modules.items()}
    kinds = sorted({m.kind for m in adapter.modules.values() if m.kind != "lora"})
    notes = [f"{'/'.join(ADAPTER_KIND_WORDS[k] for k in kinds)} modules written as their exact A/B pairs "
             "(Kronecker / face-splitting products): no approximation."] if kinds else []
    dora = baked_targets(adapter)
    if not dora:
        return factors, " ".join(notes)
    missing = [t for t in dora if base_weights is None or f"{t}.weight" not in base_weights]
    if missing:
        raise H3AppError(f"the adapter is a DoRA ({len(dora)} modules, e.g. {missing[0]}): a plain LoRA can hold it "
                         "only as its ΔW at one strength, computed from the base weights its row norms read; give "
                         "--model (the model it is for) and --scale, or use the file as it is.")
    assert base_weights is not None
    worst = 0.0
    for target in dora:
        module = adapter.modules[target]
        s = effective_scale(module.alpha, strength, module.rank, module.use_rslora,
                            block_strength=blocks.factor_of(target))
        W = base_weights[f"{target}.weight"].double()
        adapted = W + s * (module.up.double() @ module.down.double())
        assert module.magnitude is not None
        delta = module.magnitude.double()[:, None] * adapted / torch.linalg.norm(adapted, dim=1)[:, None] - W
        down, up = dense_pair(delta)
        worst = max(worst, float((up.double() @ down.double() - delta).abs().max() / delta.abs().max().clamp_min(1e-300)))
        factors[target] = (down, up)
    notes.append(f"DoRA baked at strength {strength:g} as its full-rank ΔW = m ⊙ (W + sBA)/‖W + sBA‖ − W on "
                 f"{len(dora)} modules (max relative error {worst:.1e} against the float64 rule); as a plain LoRA it "
                 "scales linearly, so other strengths are not DoRA's.")
    return factors, " ".join(notes)
