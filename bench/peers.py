"""The peers users would otherwise reach for: diffusers' H3 LoRA loader on PEFT, for the same file and model.

``lora_state_dict`` (diffusers' key conversion and the ``__metadata__`` alpha) then ``load_lora_adapter`` (PEFT
injection), ``set_adapters`` (PEFT's per-layer scale loop) and ``unload_lora``. PEFT is a dev dependency
(requirements-dev.txt); without it the peer columns read "not installed".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PEER_ADAPTER = "bench"


def peft_available() -> bool:
    try:
        import peft  # noqa: F401
    except ImportError:
        return False
    return True


def quiet_diffusers() -> None:
    """diffusers logs an info line per load; the report is stdout, progress stderr — keep both readable."""
    from diffusers.utils import logging

    logging.set_verbosity_error()


def diffusers_state_dict(path: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """diffusers' reading of an H3 LoRA file: converted state dict and the LoRA config metadata (alpha)."""
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    return MiniMaxH3LoraLoaderMixin.lora_state_dict(str(path), return_lora_metadata=True)


def diffusers_attach(transformer: Any, path: Path, adapter_name: str = PEER_ADAPTER) -> None:
    """``lora_state_dict`` + ``load_lora_adapter``: what ``pipe.load_lora_weights`` does for the transformer."""
    from h3app.rules.choices import MAIN_PARTITION

    state_dict, metadata = diffusers_state_dict(path)
    transformer.load_lora_adapter(state_dict, prefix=MAIN_PARTITION, metadata=metadata, adapter_name=adapter_name)


def diffusers_detach(transformer: Any) -> None:
    """Remove every PEFT layer (the model's own Linear modules back in place)."""
    if getattr(transformer, "peft_config", None):
        transformer.unload_lora()


def peft_set_weight(transformer: Any, weight: float, adapter_name: str = PEER_ADAPTER) -> None:
    """A strength change the PEFT way: ``set_adapters`` → ``set_weights_and_activate_adapters`` over every module."""
    transformer.set_adapters([adapter_name], weights=[weight])
