"""The attention backend a loaded transformer runs: chosen at load from the GPU and what is installed, set through
diffusers' public dispatcher API (``set_attention_backend`` inside ``attention_backend``).

The rule and the words are ``h3app.rules.attention`` (torch-free, shared with the plan); this module reads the
machine (``torch.cuda.get_device_capability``, ``importlib.util.find_spec``) and applies the choice. On a CPU, and
wherever the choice is SDPA, nothing is set: diffusers' default (SDPA) runs exactly as before.
"""

from __future__ import annotations

import importlib.util
import weakref
from typing import Any

import torch

from ..errors import H3AppError
from ..rules import attention as rule

HALF_DTYPES = (torch.bfloat16, torch.float16)
# transformer → the backend :func:`apply` set on it (diffusers has no public getter; a transformer absent: SDPA)
_APPLIED: weakref.WeakKeyDictionary[torch.nn.Module, rule.AttentionBackend] = weakref.WeakKeyDictionary()


def installed() -> frozenset[str]:
    """The backends' modules importable here (found, not imported: importing flash-attn takes seconds)."""
    return frozenset(b.module for b in rule.ATTENTION_BACKENDS
                     if b.module is not None and importlib.util.find_spec(b.module) is not None)


def arch(device: str) -> str | None:
    """``device``'s GPU architecture (``rules.attention.arch_of``), None for a CPU or MPS device."""
    if not str(device).startswith("cuda"):
        return None
    return rule.arch_of(tuple(torch.cuda.get_device_capability(torch.device(device))))  # type: ignore[arg-type]


def chosen(device: str, dtype: torch.dtype, asked: str = rule.AUTO, split: str = "") -> rule.AttentionBackend:
    """The backend a transformer on ``device`` computing in ``dtype`` runs (``split``: ``ulysses``, ``ring`` or ""),
    refused in one line when ``asked`` names one that cannot run here."""
    if asked not in rule.ATTENTION_CHOICES:
        raise H3AppError(f"--attention must be one of {', '.join(rule.ATTENTION_CHOICES)}, got {asked!r}.")
    where, found, half = arch(device), installed(), dtype in HALF_DTYPES
    backend = rule.choose(where, found, asked, half=half, split=split)
    if asked != rule.AUTO:
        line = rule.refusal(backend, where, found, half=half, split=split)
        if line is not None:
            raise H3AppError(line)
    return backend


def apply(transformer: Any, backend: rule.AttentionBackend) -> None:
    """Make ``transformer``'s attention processors run ``backend``. SDPA sets nothing (diffusers' default). Others
    are set on this model alone: diffusers' ``set_attention_backend`` also makes its backend the process-wide
    default, which ``attention_backend`` restores on exit, so the VAEs keep SDPA. Called once, at load."""
    if backend is rule.SDPA:
        return
    from diffusers.models.attention_dispatch import attention_backend

    try:
        with attention_backend(rule.SDPA.dispatcher):
            transformer.set_attention_backend(backend.dispatcher)
    except (RuntimeError, ValueError) as error:  # diffusers' own requirement check (a package too old, …)
        raise H3AppError(f"--attention {backend.name}: diffusers cannot use {backend.label} here "
                         f"({' '.join(str(error).split())[:200]}); use --attention auto.") from error
    _APPLIED[transformer] = backend


def in_use(transformer: Any) -> rule.AttentionBackend:
    """The backend ``transformer``'s attention runs: the one :func:`apply` set on it, else SDPA (diffusers'
    default, what the CPU and every unset transformer run)."""
    return _APPLIED.get(transformer, rule.SDPA)


def startup_line(options: Any) -> str:
    """What the start-up line says of attention for a model placed by ``options`` (a ``LoadOptions``)."""
    backend = chosen(options.device, options.dtype, options.attention, options.split)
    return rule.describe(backend, arch(options.device), options.attention)
