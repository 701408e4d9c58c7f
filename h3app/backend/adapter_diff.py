"""How two adapters differ, for the page's panel: both files fetched and normalised through the binder's cache
(the held model's shapes and source policy; no weight of the model is read), compared by ``lora.similarity``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..lora.similarity import compare_adapters
from ..rules.choices import T2VA
from ..settings import LoRASettings

if TYPE_CHECKING:
    from .adapter_binding import AdapterBinder


def diff_adapters(binder: AdapterBinder, a: LoRASettings, b: LoRASettings, token: str | None = None,
                  workflow: str = T2VA) -> dict[str, Any]:
    """``{"cosine", "norm_a", "norm_b", "modules", "blocks": [{"block", "group", "norm_a", "norm_b", "cosine"}…],
    "notes"}`` of ``a`` against ``b``, each at its own alpha and strength (``diff``'s JSON)."""
    loaded = [binder.load(settings, workflow, token) for settings in (a, b)]
    return compare_adapters(loaded[0].adapter, a, loaded[1].adapter, b).to_json()
