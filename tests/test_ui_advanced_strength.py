"""The UI's "Advanced strength" section without a browser: its form checks every value through h3app.rules (the
CLI's one-line refusals), its note says what the values mean, its plot shows the schedule's factor per evaluation."""

from __future__ import annotations

import re

import pytest

from h3app.errors import H3AppError
from h3app.settings import LoRASettings
from h3app.ui.adapter.advanced_strength import FIELDS, AdvancedForm, note, schedule_plot


def test_the_form_gives_canonical_settings_fields_and_refuses_bad_values():
    form = AdvancedForm(video_strength=1, audio_strength=0, text_strength=None, strength_schedule="LINEAR:1:0.5",
                        block_strength="40-49:1.2; 0-9:0.5")
    with pytest.raises(H3AppError, match="text strength must be"):
        form.fields()
    form = AdvancedForm(audio_strength=0, strength_schedule="LINEAR:1:0.5", block_strength="40-49:1.2; 0-9:0.5")
    fields = form.fields()  # typed, parsed once: the JSON spells them canonically
    assert form.settings().advanced_json() == {"video_strength": 1.0, "text_strength": 1.0, "audio_strength": 0.0,
                                               "strength_schedule": "linear:1:0.5", "block_strength": "0-9:0.5,40-49:1.2"}
    settings = LoRASettings(source="x", **fields)
    assert AdvancedForm.of(settings).fields() == fields  # load settings shows what the run used
    with pytest.raises(H3AppError, match=r"audio strength 3 is outside the strength sliders' range \(between 0 and 2\)"
                                         r".*not clamped.*the API and the CLI take up to ±100"):
        AdvancedForm(audio_strength=3).fields()  # the slider's ends are its rule's; the text box takes ±100
    assert AdvancedForm(text_strength=-3).fields()["text_strength"] == -3.0


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
    # a schedule that does not parse: the note under the section says why, once; the plot points there and never
    # shows the typed value (as markup or otherwise)
    unparsed = schedule_plot("<b>:1", 5)
    assert "the note below says why" in unparsed and "<b>" not in unparsed
    assert note(AdvancedForm(strength_schedule="<b>:1")).startswith("⚠ ")


def test_history_labels_and_differences_name_the_advanced_strengths():
    from h3app.ui.presenters import history_words

    plain = {"source": "/demo/style.safetensors", "rank": 4, "stored_alpha": 2.0, "alpha_source": "metadata",
             "resolved_alpha": 2.0, "resolved_alpha_source": "metadata", "strength": 1.0, "mode": "unmerged"}
    quiet = {**plain, "audio_strength": 0.0, "strength_schedule": "linear:1:0.5"}
    request = {"prompt": "a red ball", "seed": 0, "steps": 9}
    label = history_words.entry_label("generate", {"request": request, "adapters": [quiet]})
    assert label.endswith("× 1; audio ×0, schedule linear:1:0.5"), label
    assert "audio" not in history_words.entry_label("generate", {"request": request, "adapters": [plain]})
    a, b = ({"request": request, "adapters": adapters} for adapters in ([plain], [quiet]))
    assert history_words.differences(a, b) == [("audio strength", "1 → 0"), ("strength schedule", "none → linear:1:0.5")]
    two = {"request": request, "adapters": [plain, {**plain, "block_strength": "0:2"}]}
    assert history_words.differences(a, two)[-1] == ("block strength 2", "— → 0:2")
    assert ("audio strength", "0 → —") in history_words.differences(b, {"request": request, "adapters": []})


def test_load_settings_puts_the_advanced_strengths_back_in_their_slot(tmp_path):
    import json

    from h3app.ui.generate.settings_file import load_settings_view

    set_ = {"video_strength": 0.8, "text_strength": 1.0, "audio_strength": 0.0, "strength_schedule": "cosine:1:0",
            "block_strength": "0-1:0.5"}
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"request": {"prompt": "a fox", "seed": 3, "steps": 5},
                                "adapters": [{"source": "owner/repo", "alpha": None, "strength": 1.0, **set_},
                                             {"source": "older/file", "alpha": None, "strength": 0.5}]}))
    view = load_settings_view(str(path))
    assert view.slots["1"].advanced.settings().advanced_json() == set_
    assert view.slots["2"].advanced.fields() == AdvancedForm().fields()  # a file from before the section: all 1
    assert LoRASettings(source="x", **view.slots["1"].advanced.fields()).audio_strength == 0.0


def test_copy_as_cli_gives_the_run_its_advanced_strengths_and_the_other_tools_say_what_they_cannot():
    import shlex

    from h3app.cli import build_parser
    from h3app.commands.generate import adapters_from_args
    from h3app.ui.presenters import snippets

    first = {"source": "owner/a", "alpha": None, "rank": 4, "resolved_alpha": 4.0, "strength": 1.0, "video_strength": 1.0,
             "text_strength": 0.5, "audio_strength": 0.0, "strength_schedule": "linear:1:0.5@0-0.5",
             "block_strength": "0-9:0.5,40-49:1.2"}
    second = {"source": "owner/b", "alpha": 8.0, "rank": 4, "strength": 0.5, "audio_strength": 0.25,
              "block_strength": "3:2"}
    settings = {"request": {"prompt": "a fox", "seed": 1, "steps": 5}, "adapters": [first, second]}
    command = snippets.h3app_command(settings)
    argv = shlex.split(" ".join(line for line in command.splitlines() if not line.startswith("#")).replace("\\", ""))
    assert argv[:3] == ["python", "-m", "h3app"]
    ran = adapters_from_args(build_parser().parse_args(argv[3:]))
    assert [a.source for a in ran] == ["owner/a", "owner/b"]
    for got, want in zip(ran, (first, second)):
        assert got.advanced_json() == {**AdvancedForm().settings().advanced_json(),
                                       **{f: want[f] for f in FIELDS if f in want}}
    sglang = snippets.sglang_command(settings)
    assert sglang.command.startswith("# this run") and "--lora-scale" in sglang.command  # a command, with notes:
    notes = sglang.notes
    assert any("per-modality strength (video 1, text 0.5, audio 0)" in n for n in notes)
    assert any("strength schedule (linear:1:0.5@0-0.5) has no equivalent" in n for n in notes)
    assert any("export --block-strength 3:2" in n for n in notes)
    diffusers = snippets.diffusers_snippet(settings)
    assert "--block-strength 0-9:0.5,40-49:1.2" in diffusers and "# NOTE: diffusers (set_adapters)" in diffusers
    assert "has no equivalent there" in diffusers and "--audio-strength" not in diffusers


def test_the_profile_block_bars_follow_the_per_block_strength():
    from test_ui_logic import basis

    from h3app.lora.profile_rescale import profile_view, relative_updates

    b = basis()
    base = relative_updates(b, None, 1.0)
    scaled = relative_updates(b, None, 1.0, "1:0.25")
    assert all(scaled[t] == (base[t] * 0.25 if t.startswith("transformer_blocks.1.") else base[t]) for t in base)
    bars = {row["block"]: row["relative update"] for row in profile_view(b, None, 1.0, "1:0.25").by_block}
    plain = {row["block"]: row["relative update"] for row in profile_view(b, None, 1.0).by_block}
    assert bars == {"block 0": plain["block 0"], "block 1": pytest.approx(plain["block 1"] * 0.25)}
