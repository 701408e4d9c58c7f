"""Load settings: a previous run's settings (the JSON this app showed, or the one an mp4 it wrote carries) back into
the controls, as forms."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...backend import media
from ...errors import H3AppError
from ...rules.choices import NO_CACHE, T2VA, UNMERGED
from ...rules.request_defaults import defaults_for
from ..adapter.advanced_strength import AdvancedForm
from ..forms import RequestForm, SlotForm
from ..user_error import user_error

ADVANCED_DEFAULTS = dict(AdvancedForm().values)  # a file from before the section: every factor 1, no schedule


def read_settings_file(path: str | None) -> dict[str, Any]:
    """The settings JSON of a previous run: from an mp4 this app wrote, or a .json file."""
    if not path:
        raise H3AppError("no file given: upload a settings .json or an .mp4 made by this app.")
    file = Path(str(getattr(path, "name", path)))
    try:
        if file.suffix.lower() == ".mp4":
            data = media.read_settings(file)
            if data is None:
                raise H3AppError(f"{file.name} carries no h3app settings: use an mp4 made by this app.")
        else:
            data = json.loads(file.read_text(encoding="utf-8"))
    except H3AppError:
        raise
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise H3AppError(f"could not read settings from {file.name} ({type(error).__name__}): upload the .json "
                         f"this app showed, or an mp4 it made.") from error
    if not isinstance(data, dict) or not isinstance(data.get("request"), dict):
        raise H3AppError(f"{file.name} has no \"request\" settings: upload the .json this app showed, or an mp4 it "
                         f"made.")
    return data


def settings_to_controls(data: Mapping[str, Any]) -> dict[str, Any]:
    """Control values from a settings JSON: request fields, and per slot source/weight/revision/override/alpha/scale
    and the advanced strengths (revision pinned to the commit the file came from, when known)."""
    request = data["request"]
    adapters = list(data.get("adapters") or ([data["adapter"]] if data.get("adapter") else []))
    controls: dict[str, Any] = {
        "workflow": request.get("workflow", T2VA), "prompt": request.get("prompt", ""),
        **{name: request.get(name, getattr(defaults_for(data.get("model")), name))  # missing: the model's default
           for name in ("seed", "steps", "duration")},
        "height": request.get("height"), "width": request.get("width"), "shift": request.get("shift"),
        "audio_shift": request.get("audio_shift"), "cache": request.get("cache", NO_CACHE) != NO_CACHE,
        "mode": adapters[0].get("mode", UNMERGED) if adapters else UNMERGED,
    }
    for slot in ("1", "2"):
        index = int(slot) - 1
        adapter = adapters[index] if index < len(adapters) else None
        controls[f"slot{slot}"] = None if adapter is None else {
            "source": adapter.get("source", ""), "weight_name": adapter.get("weight_name"),
            "revision": adapter.get("commit") or adapter.get("revision") or "",
            "override": adapter.get("alpha") is not None, "alpha": adapter.get("alpha"),
            "strength": float(adapter.get("strength", 1.0)),
            **{name: adapter.get(name, default) for name, default in ADVANCED_DEFAULTS.items()},
        }
    return controls


@dataclass(frozen=True)
class SettingsView:
    """Controls restored from a settings file: the request, the LoRA mode, each slot (None: emptied) and a status
    line naming inputs that must be uploaded again."""

    request: RequestForm
    mode: str
    slots: Mapping[str, SlotForm | None]
    load_status: str


def load_settings_view(path: str | None) -> SettingsView:
    """Read a settings .json or an mp4 made here into the controls' values."""
    try:
        data = read_settings_file(path)
        controls = settings_to_controls(data)
    except H3AppError as error:
        raise user_error(error) from error
    request = RequestForm(**{name: controls[name] for name in ("workflow", "prompt", "seed", "steps", "duration",
                                                               "height", "width", "shift", "audio_shift", "cache")})
    slots: dict[str, SlotForm | None] = {}
    for slot in ("1", "2"):
        adapter = controls[f"slot{slot}"]
        slots[slot] = None if adapter is None else SlotForm(
            source=adapter["source"], weight=adapter["weight_name"], revision=adapter["revision"],
            override=adapter["override"], alpha="" if adapter["alpha"] is None else f"{float(adapter['alpha']):g}",
            strength=adapter["strength"], advanced=AdvancedForm(**{name: adapter[name] for name in ADVANCED_DEFAULTS}))
    missing = [k for k in ("first_frame", "last_frame") if data["request"].get(k)]
    if data["request"].get("references"):
        missing.append("references")
    status = "Settings restored" + (f" — upload these again: {', '.join(missing)}." if missing else ".")
    return SettingsView(request, controls["mode"], slots, status)
