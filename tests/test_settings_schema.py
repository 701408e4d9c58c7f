"""One schema for an adapter's settings (issue 54; docs/architecture.md, "Adding a per-adapter setting"): each
advanced strength is declared once, in ``LoRASettings``, and every surface is derived from ``settings.KNOBS``."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import gradio as gr
import pytest

from h3app.cli import build_parser
from h3app.commands.model_options import SPEC_KEYS, parse_adapter_spec
from h3app.settings import ALIASES, FACTOR, KNOBS, LoRASettings, recorded
from h3app.ui.adapter import advanced_strength
from h3app.ui.presenters import history_words
from h3app.ui.presenters.visitor_words import visitor_text
from h3app.ui.serving.api import ApiEvents, documented
from h3app.ui.session import ADAPTER_SCHEMA, adapters_json_words

ROOT = Path(__file__).resolve().parents[1] / "h3app"
# One value per knob, as a person would type it (a factor other than 1, a non-empty spelling).
TYPED = {knob.name: ("0.5" if knob.kind == FACTOR else knob.example.split(" · ")[0]) for knob in KNOBS}


def spelled_in(name: str) -> list[str]:
    """The files of h3app/ that spell ``name`` out: as a string (``"audio_strength"``) or as a flag."""
    flag = "--" + name.replace("_", "-")
    pattern = re.compile(rf"""["']{name}["']|{re.escape(flag)}(?![\w-])""")
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if pattern.search(p.read_text()))


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_each_advanced_strength_is_spelled_in_at_most_two_files(knob):
    """The schema and the page's placement; every other surface reads the knob."""
    files = spelled_in(knob.name)
    assert len(files) <= 2, files
    assert set(files) <= {"settings.py", "ui/adapter/advanced_strength.py"}, files


def test_the_spelling_scan_finds_a_spelled_name():
    """The scan above can fail: it finds the names where they are still spelled (the placement's rows)."""
    assert "ui/adapter/advanced_strength.py" in spelled_in("block_strength")
    assert spelled_in("no_such_setting_anywhere") == []


def test_every_knob_reaches_the_command_line_and_the_spec():
    parser = build_parser()
    generate = next(a for a in parser._subparsers._group_actions[0].choices.values() if a.prog.endswith("generate"))
    flags = {option for action in generate._actions for option in action.option_strings}
    spec = ",".join(f"{knob.key}={TYPED[knob.name]}" for knob in KNOBS)
    settings = parse_adapter_spec(f"owner/repo,{spec}", "unmerged")
    for knob in KNOBS:
        assert knob.flag in flags and SPEC_KEYS[knob.key] == knob.name and ALIASES[knob.key] == knob.name
        assert knob.is_set(getattr(settings, knob.name)), knob.name


def test_every_knob_reaches_the_json_the_schema_and_the_api():
    settings = LoRASettings("owner/repo", **TYPED)
    data = settings.to_json()
    assert LoRASettings.from_json(data) == settings
    assert LoRASettings.from_json({"source": "owner/repo", **{k.key: TYPED[k.name] for k in KNOBS}}) == settings
    words = adapters_json_words()
    for knob in KNOBS:
        assert knob.name in ADAPTER_SCHEMA["properties"] and f'"{knob.name}"' in words
        assert recorded(data)[knob] == data[knob.name]
    for endpoint in (ApiEvents.load, ApiEvents.set_lora):
        shown = inspect.signature(documented(getattr(ApiEvents(None, None, None), endpoint.__name__), "doc"))
        names = list(shown.parameters)
        knobs = [knob.name for knob in KNOBS]
        start = names.index(knobs[0])
        assert names[start:start + len(knobs)] == knobs, names  # one named parameter per knob, in KNOBS order


def test_every_knob_reaches_the_page_the_history_and_the_visitor_words():
    with gr.Blocks():
        section = advanced_strength.build("1")
    assert list(section.parts) == [knob.name for knob in KNOBS]
    for knob in KNOBS:
        control = section.parts[knob.name]
        assert control.label == knob.label and control.elem_id == f"{knob.name.replace('_', '-')}-1"
        assert knob.label in visitor_text(f"use {knob.flag} instead.")
    label_words = history_words.advanced_words(LoRASettings("owner/repo", **TYPED).to_json())
    assert set(label_words) == {knob.words for knob in KNOBS}
