"""Values the adapters package hands to the rest of h3app.

``AdapterInfo`` is what inspection learns from the header alone (the ``inspect --json`` contract).
``NormalisedAdapter`` is the same file after normalisation: canonical targets (unfused diffusers module names
of the transformer) with their factors and resolved alpha, ready for the LoRA engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only for annotations: inspection (and the CLI's inspect) never imports torch
    import torch

from ..rules.alpha_source import AlphaSource
from .not_applied import NotApplied
from .resolved import resolve_adapter
from .training import TrainingInfo


@dataclass(frozen=True)
class ModuleLoRA:
    """The LoRA of one canonical target.

    ``down`` is A with shape ``[rank, in_features]``, ``up`` is B with shape ``[out_features, rank]``, both in the
    file's dtype, already reordered to the diffusers layout (q/k/v split, SwiGLU halves, de-interleave).
    The effective scale is ``alpha * strength / rank`` (``/ sqrt(rank)`` when ``use_rslora``).
    """

    target: str
    down: torch.Tensor
    up: torch.Tensor
    alpha: float
    alpha_source: AlphaSource
    use_rslora: bool = False
    source_keys: tuple[str, ...] = ()
    scale_rank: int = 0  # what alpha is divided by when it is not the width (LoKr's dim, LoHa's rank); 0: the width
    kind: str = "lora"  # the file's adapter kind (``adapters/kinds``): "lora", "lokr", "loha"
    alpha_applies: bool = True  # False: the kind ignores alpha (a LoKr with both factors whole: scale 1 × strength)
    magnitude: torch.Tensor | None = None  # DoRA's magnitude ``[out]`` (PEFT's rule, ``h3app.lora.dora``), or None

    @property
    def rank(self) -> int:
        """The rank the scale formula divides by: ``scale_rank``, else the factors' width."""
        return self.scale_rank or self.width

    @property
    def width(self) -> int:
        """The factors' inner size: ``A [width, in]``, ``B [out, width]`` (a LoKr/LoHa's exact pair may be wider than
        its rank)."""
        return int(self.down.shape[0])


@dataclass(frozen=True)
class ExactPart:
    """One exact part on one model parameter (``h3app.adapters.parts``): ``kind`` ``diff``/``diff_b`` (a delta Δ,
    applied as ``P + strength · Δ`` in fp32, no alpha or rank) or ``set_weight``/``set_bias`` (a replacement;
    strength does not apply). ``tensor`` has the parameter's shape, in the file's dtype."""

    parameter: str
    kind: str
    tensor: torch.Tensor
    source_key: str = ""

    @property
    def module(self) -> str:
        return self.parameter.rpartition(".")[0]


@dataclass(frozen=True)
class HeadBank:
    """A bank of output heads for ``module`` (``proj_out`` / ``audio_proj_out``): ``weight [n, out, in]`` and
    ``bias [n, out]`` (or None), combined per evaluation (``h3app.adapters.head_bank``)."""

    module: str
    weight: torch.Tensor
    bias: torch.Tensor | None
    source_keys: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return int(self.weight.shape[0])


@dataclass(frozen=True)
class AdapterInfo:
    """What the header says (no weight data read): the ``inspect --json`` contract (docs/adapters.md)."""

    format: str
    suffix_style: str
    prefix: str
    rank: int | None
    ranks: Mapping[str, int]
    alpha: float | None
    alpha_source: AlphaSource
    alphas: Mapping[str, float]
    alpha_sources: Mapping[str, AlphaSource]
    num_targets: int
    targets: tuple[str, ...]
    dtype: str
    file_bytes: int
    warnings: tuple[str, ...] = ()
    hints: Mapping[str, Any] = field(default_factory=dict)
    known: Mapping[str, Any] | None = None
    use_rslora: bool = False
    unmatched_keys: tuple[str, ...] = ()
    reference_targets: tuple[str, ...] = ()
    sglang: Mapping[str, Any] = field(default_factory=dict)  # what sglang's alpha rules read (adapters/sglang.py)
    parts: Mapping[str, int] = field(default_factory=dict)  # A/B pairs, each exact part kind, head bank size
    partition: str | None = None  # fl2va / ref2va (the workflow whose DiT the file is for) or None (unknown)
    partition_source: str | None = None  # metadata / keys / name
    skipped_parts: Mapping[str, int] = field(default_factory=dict)  # left out on request (--skip-parts), by kind
    head_bank_modules: tuple[str, ...] = ()
    not_applied: NotApplied = NotApplied()  # every key a run leaves out, by reason (adapters/not_applied.py)
    training: TrainingInfo = TrainingInfo()  # how the header metadata says it was trained (adapters/training.py)
    recipe: Mapping[str, Any] = field(default_factory=dict)  # declared sampling recipes vs the registry's

    def to_json(self) -> dict[str, Any]:
        data = {
            "format": self.format,
            "suffix_style": self.suffix_style,
            "prefix": self.prefix,
            "rank": self.rank,
            "ranks": dict(self.ranks),
            "alpha": self.alpha,
            "alpha_source": str(self.alpha_source),
            "alphas": dict(self.alphas),
            "alpha_sources": {target: str(source) for target, source in self.alpha_sources.items()},
            "num_targets": self.num_targets,
            "targets": list(self.targets),
            "dtype": self.dtype,
            "file_bytes": self.file_bytes,
            "warnings": list(self.warnings),
            "hints": dict(self.hints),
            "known": dict(self.known) if self.known is not None else None,
            "use_rslora": self.use_rslora,
            "unmatched_keys": list(self.unmatched_keys),
            "reference_targets": list(self.reference_targets),
            "sglang": dict(self.sglang),
            "parts": dict(self.parts),
            "partition": self.partition,
            "partition_source": self.partition_source,
            "skipped_parts": dict(self.skipped_parts),
            "head_bank_modules": list(self.head_bank_modules),
            "not_applied": self.not_applied.to_json(),
            "training": self.training.to_json(),
            "recipe": dict(self.recipe),
        }
        # What it runs at by default (auto alpha, scale 1): the resolved adapter every surface shows.
        data["resolved"] = resolve_adapter(data).to_json()
        return data


@dataclass(frozen=True)
class NormalisedAdapter:
    """An adapter file in canonical form: ``modules`` maps canonical target → its LoRA.

    ``unmatched_keys`` are adapter keys that matched no target of the model vocabulary (never dropped silently);
    ``reference_modules`` are targets for the ``transformer_ref`` partition, kept apart.
    ``identity`` is a stable id of the file (path or repo/revision/file plus size and sha256 when known).
    ``parts`` (by parameter) and ``banks`` (by head module) are the exact parts and head banks for the partition.
    """

    info: AdapterInfo
    modules: Mapping[str, ModuleLoRA]
    unmatched_keys: tuple[str, ...] = ()
    reference_modules: Mapping[str, ModuleLoRA] = field(default_factory=dict)
    identity: str = ""
    parts: Mapping[str, ExactPart] = field(default_factory=dict)
    banks: Mapping[str, HeadBank] = field(default_factory=dict)

    @property
    def has_exact_parts(self) -> bool:
        return bool(self.parts or self.banks)

    @property
    def has_magnitudes(self) -> bool:
        """A DoRA adapter: its magnitude applies at any strength, so strength 0 is not the base (off = detached)."""
        return any(m.magnitude is not None for m in self.modules.values())


@dataclass(frozen=True)
class HeaderView:
    """A safetensors header as inspection needs it, from a local file or from a remote one (HTTP ranges).

    ``tensors`` maps key → (dtype string such as ``"F32"``/``"BF16"``, shape); ``scalars`` holds the values of
    0-dim tensors (``.alpha``; a few bytes each); ``adapter_config`` is ``adapter_config.json`` from the same
    folder (or None); ``file_bytes`` is the file size; ``name`` is the file name used in messages.
    """

    tensors: Mapping[str, tuple[str, tuple[int, ...]]]
    metadata: Mapping[str, str]
    scalars: Mapping[str, float]
    adapter_config: Mapping[str, Any] | None
    file_bytes: int
    name: str
    sidecars: Mapping[str, Any] = field(default_factory=dict)  # recipe files beside it, by name (adapters/recipe.py)
