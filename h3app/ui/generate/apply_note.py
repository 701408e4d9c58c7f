"""What the next run applies, and why a job would not run: the line above Generate, the status line of a refused
click, and when that line goes. One line per problem on the page: a refused value is said once, at its control (the
adapter card, the alpha card, the note under Advanced strength or under Steps); these lines point there."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...adapters.resolved import resolve_adapter
from ...adapters.summary import AdapterSummary, advanced_words, describe
from ...errors import H3AppError
from ...settings import LoRASettings
from ..forms import SlotForm, SyncForm
from ..presenters.visitor_words import visitor_text
from ..session import new_session

APPLY_NOTE_EMPTY = "Generate runs the **base model** (no adapter in the panel)."
NOT_RUN = "✖ Not run"  # how a job's refusal starts in its tab's status line (an input's change clears it)
REQUEST_REFUSED = "a request value is refused (the note under Steps says why)"


def slot_problem(slot: SlotForm, mode: str | None) -> str | None:
    """Where the page already says why a slot's value is refused — its source (the adapter card), its alpha or
    scale (the alpha card), an Advanced strength value (the note under them) —, or the refusal itself where no
    control says it; None when the slot is empty or its settings pass. One line per problem on the page: the
    sentence stays at its control, other places point there."""
    if not slot.source_to_read:
        return None
    if slot.refused:
        return "its source is refused (its card says why)"
    try:
        slot.alpha_value()
        slot.strength_value()
    except H3AppError:
        return "its alpha or scale is refused (the alpha card says why)"
    try:
        slot.advanced.settings()
    except H3AppError:
        return "an Advanced strength value is refused (the note there says why)"
    try:
        slot.settings(mode)
    except H3AppError as error:
        return visitor_text(str(error))
    return None


def refusal_status(form: SyncForm, request_refused: bool = False, above: bool = False) -> str:
    """Why a job did not start, in its tab's status line: where the page says it (never a second copy of that
    line). ``above``: the line above the button already names each refused adapter (the Generate tab)."""
    lines = [f"{NOT_RUN}: {REQUEST_REFUSED}."] if request_refused else []
    problems = [(name, problem) for name, slot in sorted(form.slots.items())
                if (problem := slot_problem(slot, form.mode)) is not None]
    if problems and above:
        lines.append(f"{NOT_RUN}: the line above says why.")
    else:
        lines += [f"{NOT_RUN} — adapter {name}: {problem}." for name, problem in problems]
    return "  \n".join(lines) or f"{NOT_RUN}."


def apply_note(form: SyncForm) -> str:
    """What the next Generate, Equivalence check or Grid applies: the panel's adapters as they stand — Load is not
    required (a job fetches and binds what the panel shows), but this says so before the run."""
    lines = []
    for name, slot in sorted(form.slots.items()):
        if not slot.source or not str(slot.source).strip():
            continue
        problem = slot_problem(slot, form.mode)
        if problem is not None:
            lines.append(f"✖ adapter {name} is not applied: {problem}.")
            continue
        settings = slot.settings(form.mode)  # slot_problem built it without a problem
        if settings is None:  # no source to read: no adapter in this slot
            continue
        loaded = (form.session or new_session()).adapters.get(name)
        same_file = loaded is not None and (loaded.source, loaded.weight_name, loaded.revision) == (
            settings.source, settings.weight_name, settings.revision)
        state = ("loaded" if same_file else
                 "**not loaded yet**: the run fetches and binds it first (Load shows its match report beforehand)")
        advanced = advanced_words(settings.advanced_json())
        lines.append(f"Generate applies **adapter {name}**: `{Path(settings.source).name}` at "
                     f"{applied_words(slot, settings)}{advanced} — {state}.")
    return "  \n".join(lines) if lines else APPLY_NOTE_EMPTY


def stale_refusals(statuses: Mapping[Any, Any]) -> dict[Any, Any]:
    """An input changed: each status line that holds a job's refusal is cleared (the refused value's own line, at
    its control, says whether it still is); other lines stay."""
    return {status: "" for status, text in statuses.items() if str(text or "").startswith(NOT_RUN)}


def applied_words(slot: SlotForm, settings: LoRASettings) -> str:
    """What the slot will apply, in the one summary's words when Inspect has read the file (``alpha 1 (registry)
    × scale 1 → effective 0.0625``), else the settings as given (``alpha 8 × scale 1``; auto: the file's chain)."""
    info = slot.info or {}
    if info.get("resolved") is not None and (info.get("adapter") or [None])[0] == slot.source_to_read:
        # the settings passed SlotForm's checks, which are the resolver's: it cannot refuse them here
        return describe(AdapterSummary.of(resolve_adapter(info, settings.alpha, settings.strength)))
    alpha = "auto (the file's chain)" if settings.alpha is None else f"{settings.alpha:g}"
    return f"alpha {alpha} × scale {settings.strength:g}"
