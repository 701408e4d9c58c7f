"""Where an alpha comes from: the one enum every layer uses (its values are the ``alpha_source`` strings of the
``inspect --json`` contract, docs/architecture.md), in the order of the alpha chain, with the words the UI shows."""

from __future__ import annotations

from enum import StrEnum


class AlphaSource(StrEnum):
    """One tier of the alpha chain (``explicit`` > ``module_tensor`` > … > ``rank_fallback``), or ``mixed`` for an
    adapter whose modules come from several tiers. A ``StrEnum``: it compares equal to, and serialises as, its
    contract string."""

    EXPLICIT = "explicit"
    MODULE_TENSOR = "module_tensor"
    ADAPTER_CONFIG = "adapter_config"
    METADATA = "metadata"
    REGISTRY = "registry"
    RANK_FALLBACK = "rank_fallback"
    MIXED = "mixed"

    @property
    def label(self) -> str:
        """What a person reads: ``alpha 1 from <label>``."""
        return _LABELS[self]

    @property
    def short(self) -> str:
        """The label inside a sentence about one value (``1 from the file's metadata``)."""
        return _SHORT[self]

    @property
    def word(self) -> str:
        """The few words a history label has room for (``16 (rank fallback)``)."""
        return _WORDS[self]

    @classmethod
    def of(cls, value: object) -> AlphaSource:
        """The member named by ``value`` (a member or its contract string); ``rank_fallback`` for None."""
        return cls.RANK_FALLBACK if value is None else cls(str(value))


TIERS = (AlphaSource.EXPLICIT, AlphaSource.MODULE_TENSOR, AlphaSource.ADAPTER_CONFIG, AlphaSource.METADATA,
         AlphaSource.REGISTRY, AlphaSource.RANK_FALLBACK)

_LABELS = {
    AlphaSource.EXPLICIT: "your override",
    AlphaSource.MODULE_TENSOR: "the file's .alpha tensors",
    AlphaSource.ADAPTER_CONFIG: "adapter_config.json beside the file",
    AlphaSource.METADATA: "the file's header metadata",
    AlphaSource.REGISTRY: "the known-adapter registry",
    AlphaSource.RANK_FALLBACK: "nothing stored — assumed alpha = rank",
    AlphaSource.MIXED: "several sources",
}
_SHORT = {
    AlphaSource.EXPLICIT: "the explicit setting",
    AlphaSource.MODULE_TENSOR: "the module's .alpha tensor",
    AlphaSource.ADAPTER_CONFIG: "adapter_config.json",
    AlphaSource.METADATA: "the file's metadata",
    AlphaSource.REGISTRY: "the known-adapter registry",
    AlphaSource.RANK_FALLBACK: "the alpha = rank fallback",
    AlphaSource.MIXED: "several sources",
}
_WORDS = {
    AlphaSource.EXPLICIT: "typed",
    AlphaSource.MODULE_TENSOR: ".alpha tensors",
    AlphaSource.ADAPTER_CONFIG: "adapter_config.json",
    AlphaSource.METADATA: "header metadata",
    AlphaSource.REGISTRY: "registry",
    AlphaSource.RANK_FALLBACK: "rank fallback",
    AlphaSource.MIXED: "mixed sources",
}
