"""The UI's "Advanced strength" section without a browser: its form checks every value through h3app.rules (the
CLI's one-line refusals), its note says what the values mean, its plot shows the schedule's factor per evaluation."""

from __future__ import annotations

import re

import pytest

from h3app.errors import H3AppError
from h3app.settings import LoRASettings
from h3app.ui.advanced_strength import AdvancedForm, note, schedule_plot


def test_the_form_gives_canonical_settings_fields_and_refuses_bad_values():
    form = AdvancedForm(video_strength=1, audio_strength=0, text_strength=None, strength_schedule="LINEAR:1:0.5",
                        block_strength="40-49:1.2; 0-9:0.5")
    with pytest.raises(H3AppError, match="text strength must be"):
        form.fields()
    fields = AdvancedForm(audio_strength=0, strength_schedule="LINEAR:1:0.5", block_strength="40-49:1.2; 0-9:0.5").fields()
    assert fields == {"video_strength": 1.0, "text_strength": 1.0, "audio_strength": 0.0,
                      "strength_schedule": "linear:1:0.5", "block_strength": "0-9:0.5,40-49:1.2"}
    settings = LoRASettings(source="x", **fields)
    assert AdvancedForm.of(settings).fields() == fields  # load settings shows what the run used


def test_the_note_says_what_the_values_mean_or_why_not():
    assert "All factors 1" in note(AdvancedForm())
    line = note(AdvancedForm(audio_strength=0.0))
    assert "changes nothing audio rows compute themselves" in line and "unmerged only" in line
    assert note(AdvancedForm(block_strength="0-9:0.5,5-6:1")).startswith("⚠ block strength: block 5 is in two ranges")


def test_the_plot_has_one_point_per_evaluation_at_the_schedule_factors():
    svg = schedule_plot("linear:1:0.5", 5)  # 5 steps = 4 evaluations
    assert svg.startswith("<svg") and svg.count("<circle") == 4
    assert "over 4 evaluations: 1, 0.833333, 0.666667, 0.5" in svg
    assert re.findall(r"evaluation (\d): ×([\d.]+)", svg)[-1] == ("4", "0.5")
    refused = schedule_plot("1,0.5", 5)
    assert "2 values but this run has 4 evaluations" in refused and "<svg" not in refused
    assert "every evaluation at factor 1" in schedule_plot("", 5)
    assert "&lt;" in schedule_plot("<b>:1", 5)  # a typed value is shown escaped, never as markup


def test_history_labels_and_differences_name_the_advanced_strengths():
    from h3app.ui import history_words

    plain = {"source": "/demo/style.safetensors", "rank": 4, "stored_alpha": 2.0, "alpha_source": "metadata",
             "resolved_alpha": 2.0, "resolved_alpha_source": "metadata", "strength": 1.0, "mode": "unmerged"}
    quiet = {**plain, "audio_strength": 0.0, "strength_schedule": "linear:1:0.5"}
    request = {"prompt": "a red ball", "seed": 0, "steps": 9}
    label = history_words.entry_label({"kind": "generate", "settings": {"request": request, "adapters": [quiet]}})
    assert label.endswith("× 1; audio ×0, schedule linear:1:0.5"), label
    assert "audio" not in history_words.entry_label({"kind": "generate",
                                                      "settings": {"request": request, "adapters": [plain]}})
    a, b = ({"request": request, "adapters": adapters} for adapters in ([plain], [quiet]))
    assert history_words.differences(a, b) == [("audio strength", "1 → 0"), ("strength schedule", "none → linear:1:0.5")]
    two = {"request": request, "adapters": [plain, {**plain, "block_strength": "0:2"}]}
    assert history_words.differences(a, two)[-1] == ("block strength 2", "— → 0:2")
    assert ("audio strength", "0 → —") in history_words.differences(b, {"request": request, "adapters": []})
