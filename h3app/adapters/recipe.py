"""Sampling recipes an adapter declares itself (steps, flow shifts, sigma positions), beside the registry's.

A distilled adapter is made for a few noise levels; some files say which, in their own words:

- FlashGen's native LoRA: ``base_schedule`` in the safetensors metadata, a JSON list of rectified-flow positions
  from (0, 1] down to 0 (N + 1 boundaries: N transformer evaluations);
- FastH3's ``adapter_manifest.json`` beside the file: its ``sampling`` block, ``base_timesteps`` in timestep units
  out of 1000 (``[999, 749, 500, 250]``: positions 0.999 … 0.25, closed by the terminal 0);
- FastH3 V2's ``fastvideo_inference.json`` beside the file.

From any of these, ``num_inference_steps``, ``flow_shift``/``shift``, ``audio_flow_shift``/``audio_shift`` and the
positions (``base_schedule``, ``sigmas``, ``sigma_points``, ``base_timesteps``, ``dmd_denoising_steps``) are read by
name. h3app counts steps as sigma points including the terminal one (docs/cli.md), so positions ``[1, .75, .5,
.25, 0]`` declare 5 steps (4 evaluations).

:func:`compare_recipes` sets each declared value beside the registry's (``known.py``) and says which one a run
uses. A run uses what the person typed, else the registry's preset, else the model's default
(``backend/presets.py``): a declared recipe is shown, never applied on its own, as the registry's sigmas are
(diffusers' modular H3 pipeline builds its sigma grid from the steps and the shifts). A disagreement is a warning.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METADATA_SCHEDULE = "base_schedule"  # FlashGen's metadata key
MANIFEST = "adapter_manifest.json"  # FastH3's bundle manifest (its ``sampling`` block)
INFERENCE_CONFIG = "fastvideo_inference.json"  # FastH3 V2's inference settings
SIDECAR_NAMES = (MANIFEST, INFERENCE_CONFIG)
SIDECAR_MAX_BYTES = 1_000_000  # a recipe file larger than this is not read
FIELDS = ("steps", "shift", "audio_shift", "sigmas")
_POSITION_KEYS = ("base_schedule", "sigmas", "sigma_points", "base_timesteps", "dmd_denoising_steps")
_SHIFT_KEYS = {"shift": ("flow_shift", "shift", "video_shift"), "audio_shift": ("audio_flow_shift", "audio_shift")}
_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Recipe:
    """Steps (sigma points including the terminal one), flow shifts and sigma positions, as one source gives them;
    ``source`` names it (``base_schedule (file metadata)``, ``adapter_manifest.json``, …)."""

    source: str
    steps: int | None = None
    shift: float | None = None
    audio_shift: float | None = None
    sigmas: tuple[float, ...] | None = None

    def value(self, name: str) -> Any:
        return getattr(self, name)

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "steps": self.steps, "shift": self.shift, "audio_shift": self.audio_shift,
                "sigmas": list(self.sigmas) if self.sigmas is not None else None}


def read_sidecars(folder: Path) -> dict[str, Any]:
    """The recipe files beside an adapter (``SIDECAR_NAMES``) as JSON objects; a missing, oversized or malformed
    one is left out (a recipe is information, never a reason to refuse the adapter)."""
    found: dict[str, Any] = {}
    for name in SIDECAR_NAMES:
        path = folder / name
        try:
            if not path.is_file() or path.stat().st_size > SIDECAR_MAX_BYTES:
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(data, dict):
            found[name] = data
    return found


def declared_recipes(metadata: Mapping[str, str], sidecars: Mapping[str, Any]) -> tuple[Recipe, ...]:
    """Every recipe the file declares: its metadata's ``base_schedule``, then each recipe file beside it."""
    recipes = []
    schedule = _positions({METADATA_SCHEDULE: _json(metadata.get(METADATA_SCHEDULE))})
    if schedule is not None:
        recipes.append(Recipe(f"{METADATA_SCHEDULE} (file metadata)", steps=len(schedule), sigmas=schedule))
    for name in SIDECAR_NAMES:
        block = sidecars.get(name)
        if isinstance(block, Mapping) and isinstance(block.get("sampling"), Mapping):
            block = block["sampling"]
        recipe = _recipe_of(name, block) if isinstance(block, Mapping) else None
        if recipe is not None:
            recipes.append(recipe)
    return tuple(recipes)


@dataclass(frozen=True)
class RecipeRow:
    """One field: each declared value (by source), the registry's, and the one a run uses with why."""

    field: str
    declared: tuple[tuple[str, Any], ...]
    registry: Any
    used: Any
    used_from: str

    @property
    def disagrees(self) -> bool:
        values = [v for _, v in self.declared] + ([self.registry] if self.registry is not None else [])
        return any(not _same(values[0], v) for v in values[1:])

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "declared": {s: _plain(v) for s, v in self.declared},
                "known": _plain(self.registry), "used": _plain(self.used), "used_from": self.used_from,
                "disagrees": self.disagrees}


def compare_recipes(declared: Sequence[Recipe], known: Mapping[str, Any] | None,
                    defaults: Mapping[str, Any] | None = None) -> list[RecipeRow]:
    """Each field some declared recipe gives, beside the registry's (``known``: an inspect JSON's ``known``) and what a
    run uses (``defaults``: the model's request defaults; sigmas: diffusers' own grid)."""
    known = known or {}
    rows = []
    for name in FIELDS:
        values = tuple((r.source, r.value(name)) for r in declared if r.value(name) is not None)
        if not values:
            continue
        registry = known.get(name)
        if name == "sigmas":
            used, used_from = None, "diffusers' own grid from the steps and shifts (positions are shown, not applied)"
        elif registry is not None:
            used, used_from = registry, "the registry's preset (unless typed)"
        else:
            used = (defaults or {}).get(name)
            used_from = "the model's default (unless typed)"
        rows.append(RecipeRow(name, values, tuple(registry) if isinstance(registry, list) else registry, used,
                              used_from))
    return rows


def recipe_json(declared: Sequence[Recipe], known: Mapping[str, Any] | None,
                defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``inspect --json``'s ``recipe``: ``declared`` (each source's recipe), ``rows`` (:class:`RecipeRow`) and
    ``warnings`` (one per field where the declared and the registry's values differ)."""
    rows = compare_recipes(declared, known, defaults)
    return {"declared": [r.to_json() for r in declared], "rows": [r.to_json() for r in rows],
            "warnings": [disagreement(row) for row in rows if row.disagrees]}


def disagreement(row: RecipeRow) -> str:
    """``the file declares steps 9 (base_schedule (file metadata)) but the registry says 5; a run uses 5 (…)``."""
    said = ", ".join(f"{_words(v)} ({s})" for s, v in row.declared)
    registry = f" but the registry says {_words(row.registry)}" if row.registry is not None else ""
    used = f"a run uses {_words(row.used)}, {row.used_from}" if row.used is not None else f"a run uses {row.used_from}"
    return f"the file declares {row.field} {said}{registry}; {used}."


def run_notes(recipe: Mapping[str, Any] | None, used: Mapping[str, Any], said: str = "this run used") -> list[str]:
    """For a request (``used``: its steps, shift, audio_shift), one line per declared value it does not follow:
    ``declares steps 9 (…); this run used 5`` (``said``: the words before the value used)."""
    notes: list[str] = []
    for row in (recipe or {}).get("rows") or ():
        name = row.get("field")
        if name not in used or used[name] is None:
            continue
        off = [(s, v) for s, v in (row.get("declared") or {}).items() if not _same(v, used[name])]
        notes.extend(f"declares {name} {_words(v)} ({s}); {said} {_words(used[name])}" for s, v in off)
    return notes


def recipe_words(recipe: Mapping[str, Any]) -> str:
    """A declared recipe (:meth:`Recipe.to_json`) in words: ``adapter_manifest.json: 5 steps, shift 12, audio shift
    3, sigmas [0.999, 0.749, 0.5, 0.25, 0]``."""
    words = [f"{recipe['steps']} steps" if recipe.get("steps") is not None else "",
             f"shift {_words(recipe['shift'])}" if recipe.get("shift") is not None else "",
             f"audio shift {_words(recipe['audio_shift'])}" if recipe.get("audio_shift") is not None else "",
             f"sigmas {_words(recipe['sigmas'])}" if recipe.get("sigmas") else ""]
    return f"{recipe.get('source')}: " + ", ".join(w for w in words if w)


# ------------------------------------------------------------------------------------------------------- helpers
def _recipe_of(source: str, block: Mapping[str, Any]) -> Recipe | None:
    positions = _positions(block)
    steps = _int(block.get("num_inference_steps"))
    shifts = {name: next((v for v in (_float(block.get(k)) for k in keys) if v is not None), None)
              for name, keys in _SHIFT_KEYS.items()}
    if steps is None and positions is not None:
        steps = len(positions)
    if steps is None and positions is None and all(v is None for v in shifts.values()):
        return None
    return Recipe(source, steps=steps, sigmas=positions, **shifts)


def _positions(block: Mapping[str, Any]) -> tuple[float, ...] | None:
    """Rectified-flow positions, strictly decreasing from (0, 1] to a terminal 0 (added when missing); timesteps
    out of 1000 are divided by 1000; anything else: None."""
    for key in _POSITION_KEYS:
        raw = block.get(key)
        if not isinstance(raw, list) or not raw:
            continue
        values = [_float(v) for v in raw]
        if any(v is None for v in values):
            return None
        points = [float(v) for v in values if v is not None]
        if max(points) > 1.0:
            points = [p / 1000.0 for p in points]  # timesteps (FastH3's base_timesteps, dmd_denoising_steps)
        if points[-1] != 0.0:
            points.append(0.0)
        decreasing = all(a > b for a, b in zip(points, points[1:]))
        return tuple(points) if decreasing and 0.0 < points[0] <= 1.0 else None
    return None


def _json(raw: Any) -> Any:
    if not isinstance(raw, str):
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _int(value: Any) -> int | None:
    number = _float(value)
    return int(number) if number is not None and number == int(number) and number > 0 else None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b)))
    if a is None or b is None:
        return a is b
    return abs(float(a) - float(b)) <= _TOLERANCE


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _words(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(f"{float(v):g}" for v in value) + "]"
    return f"{float(value):g}" if isinstance(value, (int, float)) else str(value)
