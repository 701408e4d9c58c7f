"""Which alpha and which effective scale every module of one adapter runs at — the one place that answers it.

Words: *strength* is the user's slider (``--scale`` on the command line), *group strength* its per-group factor,
*block strength* a factor per main block (``rules.blocks``), the *step factor* the strength schedule's factor of the
evaluation now running (1 outside a run), and the *effective scale* is the multiplier of ``B·A``:
``h3app.rules.scale.effective_scale(alpha, strength, rank, use_rslora, group_strength, block_strength, step_factor)``,
float64, applied in fp32. Per-modality factors multiply rows of a layer's delta at run time (``h3app.lora.rows``);
they are the adapter's ``modality`` here.

Which alpha: an explicit alpha in the settings applies to every module; otherwise each module's stored alpha (the
alpha chain's value: metadata, ``adapter_config.json``, per-key ``.alpha``, or rank as the last resort).

An ``AdapterScale`` is shared by all layers of one adapter. Layers do not hold their own scale: each holds a
``ScaleEntry`` shared by every layer of the same *kind* (group, main block, stored alphas, ranks, rsLoRA, device), so
a slider change or a new evaluation of a schedule refills a few entries per block and costs no work per layer. Two settings with the same float64
``alpha × strength`` (8 × 1.0 and 128 × 0.0625) give the same effective scales bit for bit, at every rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

import torch

from ..rules.alpha_source import AlphaSource
from ..rules.blocks import BlockStrength
from ..rules.modality import ModalityStrength
from ..rules.scale import effective_scale
from .rows import ModalityFactors, RowTags


class ModuleAlpha(NamedTuple):
    """What a module's file says about its scale: the stored ``alpha``, the ``rank``, rsLoRA or not."""

    alpha: float
    rank: int
    use_rslora: bool = False

    @classmethod
    def of(cls, module) -> ModuleAlpha:
        """From a ``ModuleLoRA`` (``h3app.adapters.types``)."""
        return cls(float(module.alpha), int(module.rank), bool(module.use_rslora))


class ScaleEntry:
    """The effective scales of one kind of layer, refilled in place on every settings change.

    ``members``: one ``ModuleAlpha`` per row group (one for a 2D layer, three for a stacked q/k/v), None for a group
    the adapter does not cover. ``values``: float64 effective scale per group (0.0 for an uncovered one);
    ``applied``: what the arithmetic multiplies by — the values rounded once to fp32, in one fp32 tensor on the
    factors' device (0-dim for 2D, ``[g]`` for stacks), refilled in place: a compiled graph reads it as an input,
    so a settings change never recompiles. ``ranks``: per group, 0 where uncovered.
    """

    def __init__(self, members: tuple[ModuleAlpha | None, ...]) -> None:
        self.members = members
        self.ranks = tuple(m.rank if m is not None else 0 for m in members)
        self.values: tuple[float, ...] = ()
        self.applied: torch.Tensor | None = None

    @property
    def stacked(self) -> bool:
        return len(self.members) > 1


class AdapterScale:
    """One adapter's settings (explicit alpha or None, strength, group strengths, block strengths, modality factors),
    the step factor of the evaluation now running, and the shared scale entries."""

    def __init__(self, stored: Iterable[ModuleAlpha], alpha: float | None, strength: float,
                 group_strengths: Mapping[str, float], blocks: BlockStrength | None = None,
                 modality: ModalityStrength | None = None, tags: RowTags | None = None) -> None:
        alphas = {m.alpha for m in stored}
        # The stored alpha when every module has the same one (shown as the adapter's alpha), else None.
        self.chain_alpha: float | None = alphas.pop() if len(alphas) == 1 else None
        self._entries: dict[tuple, ScaleEntry] = {}
        self.own_entries = False  # one entry per layer instead of one per kind (``entry_for``)
        self.step = 1.0
        self.blocks = blocks if blocks is not None else BlockStrength()
        self.modality = ModalityFactors(modality or ModalityStrength(), tags or RowTags())
        self.update(alpha, strength, group_strengths)

    def update(self, alpha: float | None, strength: float, group_strengths: Mapping[str, float],
               blocks: BlockStrength | None = None, modality: ModalityStrength | None = None) -> None:
        """New settings: O(kinds of layers) — refill the few shared entries, no work per layer. ``blocks`` and
        ``modality`` left None keep theirs."""
        self.alpha = None if alpha is None else float(alpha)
        self.strength = float(strength)
        self.group_strengths = {group: float(value) for group, value in group_strengths.items()}
        if blocks is not None:
            self.blocks = blocks
        if modality is not None:
            self.modality.update(modality)
        self._refill()

    def set_step(self, factor: float) -> None:
        """The strength schedule's factor of the evaluation about to run (1 between runs): refill the entries."""
        if float(factor) != self.step:
            self.step = float(factor)
            self._refill()

    def _refill(self) -> None:
        for key, entry in self._entries.items():
            self._fill(key, entry)

    # ------------------------------------------------------------------------------------------------ answers
    def alpha_in_use(self, module: ModuleAlpha) -> float:
        """The alpha ``module`` runs at now: the explicit one, else its stored alpha."""
        return self.alpha if self.alpha is not None else module.alpha

    def alpha_source(self, stored_source: AlphaSource) -> AlphaSource:
        """Where the alpha in use comes from: ``explicit``, else the module's own alpha source."""
        return AlphaSource.EXPLICIT if self.alpha is not None else AlphaSource.of(stored_source)

    def scale(self, group: str, module: ModuleAlpha, block: int | None = None) -> float:
        """The float64 effective scale of ``module`` (in ``group``, in main block ``block`` or None) now."""
        return effective_scale(self.alpha_in_use(module), self.strength, module.rank, module.use_rslora,
                               self.group_strengths.get(group, 1.0), self.blocks.factor(block), self.step)

    # ------------------------------------------------------------------------------------------ shared entries
    def entry_for(self, group: str, members: tuple[ModuleAlpha | None, ...], device: torch.device,
                  block: int | None = None) -> ScaleEntry:
        """The entry every layer of this kind shares (created on first request, refilled by ``update``); with
        ``own_entries`` each call gets one of its own (a compiled grid's rows then alias no scale tensors, whatever
        their ranks: dynamo guards on which inputs are one tensor)."""
        key = (group, block, members, device) + ((len(self._entries),) if self.own_entries else ())
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = ScaleEntry(members)
            self._fill(key, entry)
        return entry

    def _fill(self, key: tuple, entry: ScaleEntry) -> None:
        group, block, members, device = key[:4]
        values = tuple(self.scale(group, m, block) if m is not None else 0.0 for m in members)
        entry.values = values
        exact = torch.tensor(values if entry.stacked else values[0], dtype=torch.float64)
        if entry.applied is None:
            entry.applied = exact.to(device=device, dtype=torch.float32)
        else:
            entry.applied.copy_(exact)  # the same float64→fp32 rounding as ``.to``, into the tensor graphs read
