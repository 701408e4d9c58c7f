"""Settings are parsed once, where they are typed, and travel as typed values after that (issue 54): a Generate
from the page parses the alpha box once and the schedule box once, though the settings pass through the slot form,
the session, the job, the binder, the resolution and the step listener."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from h3app.adapters.known import TINY_DEMO_DIR
from h3app.rules import schedule as schedule_rules
from h3app.rules import values
from h3app.settings import LoRASettings
from h3app.ui.adapter.advanced_strength import AdvancedForm
from h3app.ui.adapter.events import AdapterEvents
from h3app.ui.forms import JobForm, RequestForm, SlotForm, SyncForm
from h3app.ui.generate.events import GenerateEvents
from h3app.ui.session import RunningJobs

FAST = {"steps": 3, "height": 16, "width": 16}


def count_alpha_parses(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every call of ``rules.values.parse_alpha`` from now on, by its argument (every module that imported the name
    gets the counting one too)."""
    calls: list[Any] = []
    original = values.parse_alpha

    def counted(value: Any, *args: Any, **kwargs: Any) -> float | None:
        calls.append(value)
        return original(value, *args, **kwargs)

    for name, module in list(sys.modules.items()):
        if (name == "h3app" or name.startswith("h3app.")) and getattr(module, "parse_alpha", None) is original:
            monkeypatch.setattr(module, "parse_alpha", counted)
    return calls


def count_schedules(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every schedule made from now on (only parsing makes one: copies and replaced settings keep the object)."""
    made: list[tuple[Any, ...]] = []
    original = schedule_rules.StrengthSchedule.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(args or tuple(kwargs.items()))
        original(self, *args, **kwargs)

    monkeypatch.setattr(schedule_rules.StrengthSchedule, "__init__", counted)
    return made


@pytest.fixture(scope="module")
def events(backend):
    jobs = RunningJobs()
    return AdapterEvents(backend, jobs), GenerateEvents(backend, jobs)


@pytest.mark.slow
def test_a_generate_parses_the_alpha_box_once_and_the_schedule_once(events, monkeypatch):
    adapters, generate = events
    pick = adapters.pick_demo(str(TINY_DEMO_DIR / "tiny_turbo_4step.safetensors"))
    slot = SlotForm(source=pick.source, weight=pick.weight["value"], override=True, alpha="8", strength=0.125,
                    advanced=AdvancedForm(strength_schedule="linear:1:0.5"))
    alphas, schedules = count_alpha_parses(monkeypatch), count_schedules(monkeypatch)

    session = adapters.sync_session(SyncForm(None, "unmerged", {"1": slot}))  # the click's sync
    view = generate.generate_view(JobForm(session, "unmerged", RequestForm(prompt="a red ball", seed=1, **FAST)),
                                  progress=None)

    assert alphas == ["8"], alphas  # the box's text, once; the float it became is only range-checked after
    assert len(schedules) == 1, schedules  # the box's text, once; the run's step listener uses that object
    (adapter,) = view.settings_json["adapters"]
    assert (adapter["alpha"], adapter["strength_schedule"]) == (8.0, "linear:1:0.5")  # and the run used them


def test_copies_and_replacements_keep_the_parsed_values(monkeypatch):
    """A settings value made from text parses it; replacing another field, a deep copy (Gradio's State) or a mode
    change keeps the parsed schedule and ranges as they are."""
    import copy
    import dataclasses

    settings = LoRASettings("owner/repo", alpha="8", strength_schedule="cosine:1:0@0.2-0.8", block_strength="0-9:0.5")
    alphas, schedules = count_alpha_parses(monkeypatch), count_schedules(monkeypatch)
    changed = dataclasses.replace(settings, strength=0.5)
    held = copy.deepcopy(changed)
    assert held.strength_schedule is not None and held.strength_schedule.label == "cosine:1:0@0.2-0.8"
    assert held.block_strength.label == "0-9" + ":0.5" and held.alpha == 8.0
    assert (alphas, schedules) == ([], [])
    assert LoRASettings.from_json(held.to_json()) == held  # the one codec gives the same value back
    assert len(schedules) == 1  # reading JSON is an edge: it parses
