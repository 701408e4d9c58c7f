"""History entries in words: a label that tells two entries apart (prompt, seed, adapter settings) and the settings
two entries differ in, as a person says them ("alpha 16 (rank fallback) → 1 (registry)").

Pure functions of the settings JSON each history entry carries: ``{"request": GenerationRequest.to_json(),
"adapters": [AdapterBinding.provenance() …]}`` (generations, check columns and grid cells all write that shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...adapters import summary
from ...settings import KNOBS, recorded

NO_LORA = "none (no LoRA)"
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
    """``tiny_turbo_4step α 1 (registry) × 1`` (``adapters.summary.label``), then its advanced strengths when it
    has any (``; audio ×0, schedule linear:1:0.5``)."""
    return summary.label(summary.AdapterSummary.from_json(adapter)) + summary.advanced_words(adapter)


def file_name(adapter: Mapping[str, Any]) -> str:
    return summary.file_stem(adapter)


def entry_label(kind: str, settings: Mapping[str, Any]) -> str:
    """One line per history entry of ``kind`` run with ``settings`` (its settings JSON): ``check B · “a red ball…” ·
    seed 7 · tiny_turbo_4step α 16 (typed) × 0.0625``."""
    request = settings.get("request") or {}
    parts = [kind]
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
    alpha, scale, mode and advanced strengths)."""
    request = settings.get("request") or {}
    words = {label: (str(request[key]) if key in ("prompt", "workflow") else number(request[key]))
             for key, label in REQUEST_WORDS if key in request}
    if request.get("height") or request.get("width"):
        words["size"] = f"{request.get('width') or 'auto'}×{request.get('height') or 'auto'}"
    adapters = settings.get("adapters")
    if adapters is not None:
        if not adapters:
            words["adapter"] = NO_LORA
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
            words.update({f"{name}{tag}": value for name, value in advanced_words(adapter).items()})
    return words


ADVANCED_DEFAULTS = {k.words: k.shown(k.unset) for k in KNOBS}  # an adapter that sets none of its advanced strengths


def advanced_words(adapter: Mapping[str, Any]) -> dict[str, str]:
    """The advanced strengths an adapter sets (docs/lora-engine.md), by name, in words; the ones it leaves at
    :data:`ADVANCED_DEFAULTS` are left out (labels stay short; :func:`differences` fills them back in)."""
    words = {knob.words: knob.shown(value) for knob, value in recorded(adapter).items()}
    return {name: value for name, value in words.items() if value != ADVANCED_DEFAULTS[name]}


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``[(setting, "A → B")]`` for every setting whose words differ, in the order of :func:`setting_words`."""
    wa, wb = setting_words(a), setting_words(b)
    names = list(wa) + [name for name in wb if name not in wa]
    rows = [(name, _word(wa, name), _word(wb, name)) for name in names]
    return [(name, f"{va} → {vb}") for name, va, vb in rows if va != vb]


def _word(words: Mapping[str, str], name: str) -> str:
    """``words[name]``; an advanced strength an adapter of that slot left out is its default; anything else
    missing is "—"."""
    if name in words:
        return words[name]
    for base, default in ADVANCED_DEFAULTS.items():
        if name == base or name.startswith(f"{base} "):
            return default if words.get(f"adapter{name[len(base):]}", NO_LORA) != NO_LORA else "—"
    return "—"
