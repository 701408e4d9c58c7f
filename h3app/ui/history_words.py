"""History entries in words: a label that tells two entries apart (prompt, seed, adapter settings) and the settings
two entries differ in, as a person says them ("alpha 16 (rank fallback) → 1 (registry)").

Pure functions of the settings JSON each history entry carries: ``{"request": GenerationRequest.to_json(),
"adapters": [AdapterBinding.provenance() …]}`` (generations, check columns and grid cells all write that shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..adapters import summary

PROMPT_CHARS = 40  # of the prompt in a label; the differences show it whole
REQUEST_WORDS = (("prompt", "prompt"), ("seed", "seed"), ("steps", "steps"), ("duration", "duration (s)"),
                 ("workflow", "workflow"), ("shift", "shift"), ("audio_shift", "audio shift"))


def number(value: Any) -> str:
    """``8.0`` → ``8``; ``0.0625`` → ``0.0625``; None → ``auto`` (``adapters.summary.number``)."""
    return summary.number(value)


def alpha_words(adapter: Mapping[str, Any]) -> str:
    """The alpha(s) an adapter ran at and where they came from (``adapters.summary.alpha_text``): ``16 (rank
    fallback)``, ``1 (registry)``, ``8 (typed)``, ``2 / 4 (adapter_config.json, rsLoRA)``."""
    return summary.alpha_text(summary.AdapterSummary.from_json(adapter))


def adapter_words(adapter: Mapping[str, Any]) -> str:
    """``tiny_turbo_4step α 1 (registry) × 1`` (``adapters.summary.label``)."""
    return summary.label(summary.AdapterSummary.from_json(adapter))


def file_name(adapter: Mapping[str, Any]) -> str:
    return summary.file_stem(adapter)


def entry_label(entry: Mapping[str, Any]) -> str:
    """One line per history entry: ``check B · “a red ball…” · seed 7 · tiny_turbo_4step α 16 (typed) × 0.0625``."""
    settings = entry.get("settings") or {}
    request = settings.get("request") or {}
    parts = [str(entry.get("kind", "result"))]
    prompt = str(request.get("prompt") or "").strip()
    if prompt:
        parts.append(f"“{prompt[:PROMPT_CHARS]}{'…' if len(prompt) > PROMPT_CHARS else ''}”")
    if request.get("seed") is not None:
        parts.append(f"seed {request['seed']}")
    adapters = settings.get("adapters")
    if adapters is not None:
        parts.append(" + ".join(adapter_words(a) for a in adapters) if adapters else "no LoRA")
    return " · ".join(parts)


def setting_words(settings: Mapping[str, Any]) -> dict[str, str]:
    """The settings that decide a result, by name, in words (the request's fields, then each adapter's file,
    alpha, scale and mode)."""
    request = settings.get("request") or {}
    words = {label: (str(request[key]) if key in ("prompt", "workflow") else number(request[key]))
             for key, label in REQUEST_WORDS if key in request}
    if request.get("height") or request.get("width"):
        words["size"] = f"{request.get('width') or 'auto'}×{request.get('height') or 'auto'}"
    adapters = settings.get("adapters")
    if adapters is not None:
        if not adapters:
            words["adapter"] = "none (no LoRA)"
        for index, adapter in enumerate(adapters):
            tag = "" if index == 0 else f" {index + 1}"
            words[f"adapter{tag}"] = file_name(adapter)
            applied = summary.AdapterSummary.from_json(adapter)
            words[f"alpha{tag}"] = summary.alpha_text(applied)
            words[f"scale{tag}"] = number(applied.strength)
            if applied.scales:
                words[f"effective scale{tag}"] = summary.scale_words(applied)
            if adapter.get("mode"):
                words[f"mode{tag}"] = str(adapter["mode"])
    return words


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``[(setting, "A → B")]`` for every setting whose words differ, in the order of :func:`setting_words`."""
    wa, wb = setting_words(a), setting_words(b)
    names = list(wa) + [name for name in wb if name not in wa]
    return [(name, f"{wa.get(name, '—')} → {wb.get(name, '—')}") for name in names if wa.get(name) != wb.get(name)]
