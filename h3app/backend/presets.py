"""Turbo presets: when the registry knows an adapter, its steps, shifts and workflow become the defaults.

Anything the user gave explicitly wins; every value taken from the registry is named in ``notes`` so the user
sees why their run used 5 steps and shift 12. Without a preset: the model's own defaults
(``rules.request_defaults``; a bare call gets the tiny model's, as a bare ``GenerationRequest`` does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..adapters.known import KnownAdapter
from ..rules.request_defaults import TINY_DEFAULTS, RequestDefaults

PRESET_FIELDS = ("steps", "shift", "audio_shift", "workflow")


@dataclass(frozen=True)
class Resolved:
    """Request fields after presets, and a line for each value that came from the registry."""

    fields: dict[str, Any]
    notes: tuple[str, ...]


def resolve_presets(given: Mapping[str, Any], known: KnownAdapter | None,
                    defaults: RequestDefaults = TINY_DEFAULTS) -> Resolved:
    """Fill the ``None`` entries of ``given`` (steps, shift, audio_shift, workflow) from ``known``, then from
    the model's ``defaults``."""
    fields = dict(given)
    notes = []
    for name in PRESET_FIELDS:
        if fields.get(name) is not None:
            continue
        preset = getattr(known, name, None) if known is not None else None
        if known is not None and preset is not None:
            fields[name] = preset
            notes.append(f"{name}={preset} from the registry ({known.title})")
        else:
            fields[name] = getattr(defaults, name)
    return Resolved(fields, tuple(notes))
