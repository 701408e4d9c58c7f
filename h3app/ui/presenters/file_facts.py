"""What an adapter file says of itself beyond its weights, for the inspect card: how it was trained
(``adapters/training.py``) and the sampling recipe it declares (``adapters/recipe.py``). Pure functions of an inspect
JSON; everything from the file is HTML-escaped (an adapter header is untrusted input)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...adapters.recipe import recipe_words
from ...adapters.training import TrainingInfo
from .html_text import esc


def training_html(info: Mapping[str, Any]) -> str:
    """What the header metadata says of training (``adapters/training.py``): trainer, epoch, steps, base model,
    network dim/alpha (never applied) and the trigger words with where they come from; "" when it says nothing."""
    training = info.get("training") or {}
    facts = training_facts(training)
    triggers = training.get("trigger_words") or []
    if triggers:
        source = (training.get("sources") or {}).get("trigger_words") or "its metadata"
        facts.append("trigger word" + ("s " if len(triggers) > 1 else " ")
                     + ", ".join(f"<b>{esc(t)}</b>" for t in triggers) + f" <small>(from {esc(source)})</small>")
    return f"<div class='h3-row' data-testid='training'>{' · '.join(facts)}</div>" if facts else ""


def recipe_html(info: Mapping[str, Any]) -> str:
    """The sampling recipes the file declares (``adapters/recipe.py``), each field with the one a run uses; a
    disagreement with the registry is also among the warnings."""
    recipe = info.get("recipe") or {}
    declared = [esc(recipe_words(r)) for r in recipe.get("declared") or ()]
    if not declared:
        return ""
    used = "; ".join(f"{esc(row['field'])}: {esc(row['used_from'])}" for row in recipe.get("rows") or ())
    return (f"<div class='h3-row' data-testid='recipe'><b>declared recipe</b> {' · '.join(declared)}"
            f"<br><small>a run uses — {used}</small></div>")


def training_facts(training: Mapping[str, Any]) -> list[str]:
    """The training facts of an inspect JSON's ``training``, escaped for HTML, in ``TrainingInfo.facts``' words."""
    return [esc(fact) for fact in TrainingInfo.from_json(training).facts()]
