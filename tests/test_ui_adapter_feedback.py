"""What the adapter panel tells a person follows the one resolution, through the event functions (no browser; the
same in chromium: tests/test_ui_browser_adapter_feedback.py):
warnings measured against the adapter's own facts, overrides dropped on a switch, presets that apply their alpha,
refusals that say so, and the labels."""

from __future__ import annotations

import pytest

from h3app.adapters.known import TINY_DEMO_DIR
from h3app.adapters.resolved import resolve_adapter
from h3app.ui.adapter.events import AdapterEvents
from h3app.ui.compare.events import grid_progress
from h3app.ui.forms import SlotForm, SyncForm
from h3app.ui.generate.events import apply_note, apply_preset, refusal_status
from h3app.ui.presenters import render

TURBO = str(TINY_DEMO_DIR / "tiny_turbo_4step.safetensors")
NO_ALPHA = str(TINY_DEMO_DIR / "lightx2v_turbo_no_alpha.safetensors")
PER_MODULE = str(TINY_DEMO_DIR / "peft_diffusers_metadata.safetensors")  # alpha 2 ×33 and 1 ×1 in its metadata


@pytest.fixture(scope="module")
def events(backend):
    return AdapterEvents(backend)


def test_an_effective_scale_far_from_the_files_facts_is_flagged_whatever_the_knob(events):
    """Finding 4: alpha 128 × scale 2.56 on the rank-16 Turbo is 328× its registry alpha's 0.0625."""
    info = events.inspect(TURBO, None, None, None)
    by_alpha = resolve_adapter(info, 128.0, 2.56)
    assert by_alpha.effective_scale == pytest.approx(20.48)
    (warning,) = by_alpha.warnings
    assert "328×" in warning and "0.0625" in warning
    by_scale = resolve_adapter(info, None, 100.0)  # the same distance reached with the slider alone
    assert by_scale.warnings and "100×" in by_scale.warnings[0]
    assert resolve_adapter(info, None, 2.0).warnings == ()  # 2× is a choice, not an accident
    assert "barely show" in resolve_adapter(info, None, 0.1).warnings[0]
    readout = render.readout_html(info, 128.0, 2.56)
    assert "h3-warn" in readout and "328×" in readout


def test_switching_adapters_drops_the_override_and_says_so(events):
    """Finding 5: alpha 16 set for the Turbo does not follow to the LightX2V file."""
    first = events.inspect_view(SlotForm(source=TURBO))
    set_for_turbo = SlotForm(source=NO_ALPHA, override=True, alpha="16")
    view = events.inspect_view(set_for_turbo, previous=first.info)
    assert view.override is False and view.alpha == "128"
    assert "Override alpha 16 was for tiny_turbo_4step.safetensors: dropped" in view.alpha_html
    assert ">1<" in view.readout  # 128 / 128: its own alpha, not 16 / 128 = 0.125
    again = events.inspect_view(SlotForm(source=TURBO, override=True, alpha="2"), previous=first.info)
    assert again.override is not False and "dropped" not in again.alpha_html  # the same file keeps its override


def test_apply_preset_applies_the_alpha_its_chip_shows(events):
    info = events.inspect(TURBO, None, None, None)
    preset = apply_preset(info, "a ball")
    assert (preset.override, preset.alpha) == (False, "1")  # the registry's alpha 1 is what auto gives
    overridden = {**info, "alpha": 16.0}  # as if the chain gave another value
    preset = apply_preset(overridden, "a ball")
    assert (preset.override, preset.alpha) == (True, "1")


def test_a_refused_alpha_turns_the_alpha_card_red_and_the_job_names_it(events):
    """Finding 3: alpha "eight" or 1e9: the card stops saying green things and says why — once: the readout, the
    line above Generate and the job's status line point to the card, never copy its sentence."""
    info = events.inspect(TURBO, None, None, None)
    for bad in ("eight", "1e9"):
        slot = SlotForm(source=TURBO, override=True, alpha=bad)
        shown = events.readout(info, slot)
        assert "h3-bad" in shown.alpha_html and "not applied" in shown.alpha_html
        assert "alpha must be" in shown.alpha_html and "alpha must be" not in shown.readout
        form = SyncForm(None, "unmerged", {"1": slot})
        status, note = refusal_status(form), apply_note(form)
        assert status == "✖ Not run — adapter 1: its alpha or scale is refused (the alpha card says why)."
        assert note == "✖ adapter 1 is not applied: its alpha or scale is refused (the alpha card says why)."
        assert refusal_status(form, above=True) == "✖ Not run: the line above says why."
        both = refusal_status(form, request_refused=True, above=True)
        assert both.splitlines()[0].startswith("✖ Not run: a request value is refused (the note under Steps")


def test_a_scale_past_the_slider_is_refused_with_a_word_not_clamped(events):
    """Finding 8: -5 on a -2…4 slider."""
    info = events.inspect(TURBO, None, None, None)
    slot = SlotForm(source=TURBO, strength=-5)
    shown = events.readout(info, slot)
    assert "scale -5 is outside the Scale slider" in shown.alpha_html and "scale -5" not in shown.readout
    with pytest.raises(Exception, match="scale -5 is outside"):
        slot.settings("unmerged")


def test_a_refused_source_is_named_on_the_line_above_generate():
    """Finding 6: the line does not keep announcing the refused source as what Generate applies."""
    refused = SlotForm(source="not/a/repo!!", refused="not/a/repo!! is neither an existing local path nor a Hub "
                                                      "repo id")
    note = apply_note(SyncForm(None, "unmerged", {"1": refused}))
    assert note == "✖ adapter 1 is not applied: its source is refused (its card says why)."
    assert "not/a/repo" not in note  # the card's red line says it; this line points there


def test_labels_read_as_meant(events):
    """Finding 9: per-module alpha without "from 2 from", the rank fallback's risk said for its own rank."""
    mixed = events.inspect(PER_MODULE, None, None, None)
    card = render.alpha_card(mixed, None)
    assert "from 2 from" not in card and "alpha per module</div>2 from the file" in card
    rank_16 = {"ranks": {"t": 16}, "alphas": {"t": 16.0}, "alpha_sources": {"t": "rank_fallback"},
               "alpha_source": "rank_fallback", "alpha": 16.0}
    card = render.alpha_card(rank_16, None)
    assert "alpha 1: 16× too strong" in card and "LightX2V" not in card and "alpha 8, this is 2×" not in card
    assert grid_progress(1, 4, 6, 15) == "grid: 1 of 4 cells done · step 6 of 15 of the whole grid"
