"""One summary of what an adapter applied (``adapters/summary.py``), one formatter, and the surfaces that show it:
every demo adapter's distinct alphas and effective scales, never collided (``peft_rslora``: alphas 2 and 4 on rank 4);
the history label, the result caption, the settings JSON, the CLI's ``generate --json`` and the snippets, with the
frames and steps the run used. Event functions run in-process on the session's tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cli_runner import run_cli

from h3app.adapters.inspect import inspect_file
from h3app.adapters.known import TINY_DEMO_DIR
from h3app.adapters.resolved import resolve_adapter
from h3app.adapters.summary import AdapterSummary, alpha_text, applied_lines, describe, per_group
from h3app.rules.frames import RELEASED
from h3app.ui.adapter.advanced_strength import AdvancedForm
from h3app.ui.adapter.events import AdapterEvents
from h3app.ui.forms import KEEP, JobForm, RequestForm, SlotForm, SyncForm
from h3app.ui.generate.events import GenerateEvents, apply_note
from h3app.ui.presenters import history_words, snippets
from h3app.ui.session import RunningJobs, with_adapter

DEMOS = sorted(p for p in TINY_DEMO_DIR.iterdir() if p.suffix == ".safetensors" or p.is_dir())
RSLORA = TINY_DEMO_DIR / "peft_rslora"
FAST = {"steps": 2, "height": 16, "width": 16}


def resolution(demo: Path, alpha: float | None = None, strength: float = 1.0):
    """The library's own resolution of a shipped demo file (a PEFT folder with its adapter_config.json)."""
    config = demo / "adapter_config.json" if demo.is_dir() else None
    path = demo / "adapter_model.safetensors" if demo.is_dir() else demo
    return resolve_adapter(inspect_file(path, adapter_config_path=config), alpha, strength)


def per_target(resolved) -> tuple[set[float], set[float]]:
    """Every alpha and effective scale the engine applies, target by target (no grouping involved)."""
    return set(resolved.alphas.values()), set(resolved.scales.values())


def test_the_nine_demo_adapters_are_the_ones_shipped():
    assert len(DEMOS) == 9 and RSLORA in DEMOS


@pytest.mark.parametrize("demo", DEMOS, ids=lambda p: p.name)
def test_the_summary_carries_every_distinct_alpha_and_scale_the_targets_run_at(demo):
    resolved = resolution(demo)
    alphas, scales = per_target(resolved)
    summary = AdapterSummary.of(resolved, demo.stem)
    assert set(summary.alphas) == alphas and set(summary.scales) == scales
    # the same through the JSON a run records (provenance["resolved"])
    recorded = AdapterSummary.from_json({"source": str(demo), "strength": 1.0, "resolved": resolved.to_json()})
    assert set(recorded.alphas) == alphas and set(recorded.scales) == scales
    # the JSON values: a scalar when uniform, else per group, each group's distinct values all kept
    for value, every in ((resolved.resolved_alpha, alphas), (resolved.effective_scale, scales)):
        if len(every) == 1:
            assert value == next(iter(every))
        else:
            flat = {v for item in value.values() for v in (item if isinstance(item, list) else [item])}
            assert flat == every and set(value) == {g.group for g in resolved.groups}


def test_mixed_values_print_as_their_distinct_set_and_scalars_as_scalars():
    rslora = AdapterSummary.of(resolution(RSLORA), "peft_rslora")
    assert describe(rslora) == "alpha 2 / 4 (adapter_config.json, rsLoRA) × scale 1 → effective 1 / 2"
    assert rslora.resolved_alpha == {"attention": 4.0, "feed_forward": [2.0, 4.0], "refiner": [2.0, 4.0]}
    turbo = AdapterSummary.of(resolution(TINY_DEMO_DIR / "tiny_turbo_4step.safetensors"), "tiny_turbo_4step")
    assert describe(turbo) == "alpha 1 (registry) × scale 1 → effective 0.0625"
    assert turbo.resolved_alpha == 1.0 and turbo.effective_scale == 0.0625
    typed = AdapterSummary.of(resolution(RSLORA, alpha=8.0, strength=0.5), "peft_rslora")
    assert alpha_text(typed) == "8 (typed, rsLoRA)" and typed.scales == (8.0 * 0.5 / math.sqrt(4),)


def test_per_group_never_collides_two_values_of_one_group():
    class Row:
        def __init__(self, group, alpha):
            self.group, self.alpha = group, alpha

    assert per_group([Row("a", 2.0), Row("a", 4.0), Row("b", 4.0)], "alpha") == {"a": [2.0, 4.0], "b": 4.0}
    assert per_group([Row("a", 2.0), Row("b", 2.0)], "alpha") == 2.0
    assert per_group([], "alpha") is None


def test_a_check_column_is_the_run_resolution_at_its_own_setting():
    """The equivalence check's columns: A at a typed alpha, the fallback at alpha = rank without rsLoRA."""
    summary = AdapterSummary.of(resolution(RSLORA), "peft_rslora")
    assert summary.at(8.0, 1.0).scales == (8.0 / 2.0,)
    fallback = summary.at(None, 1.0, rank_fallback=True)
    assert fallback.alphas == (4.0,) and fallback.scales == (1.0,) and "rank fallback" in alpha_text(fallback)


# ------------------------------------------------------------------------------------------------ the page
@pytest.fixture(scope="module")
def events(backend):
    jobs = RunningJobs()
    return AdapterEvents(backend, jobs), GenerateEvents(backend, jobs)


@pytest.mark.slow
def test_generate_from_the_page_for_every_demo_adapter_shows_its_distinct_values(events):
    """The crash of the history label (a per-group alpha formatted as a number) cannot come back: every demo
    adapter runs through the Generate event, and the caption, the history label and the settings JSON say its
    distinct alphas and scales in the one formatter's words."""
    adapters, generate = events
    for demo in DEMOS:
        pick = adapters.pick_demo(str(demo))
        slot = SlotForm(source=pick.source, weight=pick.weight["value"])
        session = with_adapter(None, "1", slot.settings("unmerged"))
        form = JobForm(session, "unmerged", RequestForm(prompt="a red ball", seed=1, **FAST))
        view = generate.generate_view(form, progress=None)
        adapter = view.settings_json["adapters"][0]
        words = describe(AdapterSummary.of(resolution(demo), ""))
        assert words in view.result_html, demo.name
        assert view.settings_json["applied"] == [f"{AdapterSummary.from_json(adapter).name}: {words}"]
        newest = view.session.history[-1]
        label = history_words.entry_label(newest.kind, newest.settings)
        assert alpha_text(AdapterSummary.of(resolution(demo), "")) in label, (demo.name, label)
        alphas, scales = per_target(resolution(demo))
        assert set(AdapterSummary.from_json(adapter).alphas) == alphas, demo.name
        assert set(AdapterSummary.from_json(adapter).scales) == scales, demo.name
        assert view.settings_json["result"]["frames"] == RELEASED.frames(RELEASED.shortest_seconds)


@pytest.mark.slow
def test_the_cli_generate_json_carries_every_demo_adapters_distinct_values(capsys, tmp_path):
    specs = [arg for demo in DEMOS for arg in ("--adapter-spec", str(demo))]
    cli = run_cli(capsys, "generate", "--model", "tiny", "--prompt", "a red ball", "--steps", "2", "--height", "16",
                  "--width", "16", "--out", str(tmp_path / "x.mp4"), "--json", *specs)
    assert cli.code == 0, cli.err
    result = json.loads(cli.out)
    assert len(result["adapters"]) == len(DEMOS) == len(result["applied"])
    for demo, adapter, line in zip(DEMOS, result["adapters"], result["applied"]):
        resolved = resolution(demo)
        alphas, scales = per_target(resolved)
        assert adapter["resolved_alpha"] == resolved.resolved_alpha, demo.name
        assert adapter["effective_scale"] == resolved.effective_scale, demo.name
        groups = adapter["resolved"]["groups"]
        assert {g["alpha"] for g in groups} == alphas and {g["effective_scale"] for g in groups} == scales
        assert line.endswith(describe(AdapterSummary.of(resolved, ""))), (demo.name, line)


# ------------------------------------------------------------------------------------------------ snippets
def run_settings(duration: float = 5.0) -> dict:
    resolved = resolution(RSLORA)
    adapter = {"source": str(RSLORA), "weight_name": "adapter_model.safetensors", "rank": 4, "alpha": None,
               "resolved_alpha": resolved.resolved_alpha, "alpha_source": "adapter_config", "strength": 1.0,
               "mode": "unmerged", "resolved": resolved.to_json()}
    return {"model": "tiny", "request": {"prompt": "p", "seed": 1, "steps": 3, "duration": duration, "height": 16,
                                         "width": 16, "workflow": "t2va", "references": []},
            "adapters": [adapter], "result": {"frames": RELEASED.frames(duration)}}


def test_snippets_give_the_frames_steps_and_values_the_run_used():
    settings = run_settings()
    applied = applied_lines(settings["adapters"])[0]
    assert applied == "peft_rslora: alpha 2 / 4 (adapter_config.json, rsLoRA) × scale 1 → effective 1 / 2"
    diffusers = snippets.diffusers_snippet(settings)
    assert "num_frames=124" in diffusers and "num_frames=120" not in diffusers and "num_inference_steps=3" in diffusers
    compile(diffusers, "<snippet>", "exec")
    sglang = snippets.sglang_command(settings, [inspect_file(RSLORA / "adapter_model.safetensors",
                                                             adapter_config_path=RSLORA / "adapter_config.json"
                                                             ).to_json()]).command
    h3app = snippets.h3app_command(settings)
    for text in (diffusers, sglang, h3app):
        assert f"# applied {applied}" in text and "# this run: 124 frames, 3 steps (2 evaluations)" in text
    assert "--num-frames 124" in sglang and "--num-inference-steps 3" in sglang
    assert "--steps 3" in h3app and "--duration 5" in h3app
    # without a recorded result, the duration's frames under the released rule (17n + 5)
    del settings["result"]
    assert snippets.run_frames({**settings, "request": {**settings["request"], "duration": 10.0}}) == 243


# ------------------------------------------------------------------------------------- inputs never lost
def test_a_demo_pick_never_overwrites_a_source_the_person_gave(events):
    adapters, _ = events
    turbo, style = (str(TINY_DEMO_DIR / n) for n in ("tiny_turbo_4step.safetensors", "tiny_style_warm.safetensors"))
    asked = adapters.pick_demo(turbo, current="owner/my-lora")
    assert asked.source is KEEP and asked.weight is KEEP  # the box keeps "owner/my-lora"
    assert asked.pending == turbo and asked.confirm_box["visible"] is True
    assert "owner/my-lora" in asked.confirm_note and "tiny_turbo_4step.safetensors" in asked.confirm_note
    filled = adapters.confirm_demo(asked.pending)
    assert filled.source == turbo and filled.pending is None and filled.confirm_box["visible"] is False
    assert adapters.pick_demo(style, current=turbo).source == style  # one demo for another: nothing typed is lost
    assert adapters.pick_demo(style, current="  ").source == style
    kept = adapters.keep_source()
    assert kept.source is KEEP and kept.demo is None and kept.pending is None


def test_a_pasted_alpha_is_the_one_the_next_job_applies_and_the_note_says_so(events):
    """A paste fires no keystroke, so Override may still be unticked when Generate is clicked: the box's own
    value decides (``SlotForm.typed_alpha``)."""
    adapters, _ = events
    turbo = str(TINY_DEMO_DIR / "tiny_turbo_4step.safetensors")
    info = adapters.inspect(turbo, None, None, None)
    shown = SlotForm(source=turbo, alpha="1", info=info)  # what Inspect put in the box: the registry's alpha 1
    assert not shown.typed_alpha and shown.settings("unmerged").alpha is None
    pasted = SlotForm(source=turbo, alpha="8", info=info)
    assert pasted.typed_alpha and pasted.settings("unmerged").alpha == 8.0
    # the Override tick follows the box alone: ticked for a typed alpha, unticked for an emptied box, left alone
    # for the file's own alpha (whatever the tick read with it, which can be older than the box)
    emptied = SlotForm(source=turbo, alpha=" ", info=info)
    assert (pasted.tick_for_box, emptied.tick_for_box, shown.tick_for_box) == (True, False, None)
    note = apply_note(SyncForm(None, "unmerged", {"1": pasted}))
    assert "alpha 8 (typed) × scale 1 → effective 0.5" in note
    assert "alpha 1 (registry) × scale 1 → effective 0.0625" in apply_note(SyncForm(None, "unmerged", {"1": shown}))
    # an alpha pasted before the first Inspect is kept and ticks Override; the same file inspected again leaves the
    # panel as it stands (its values were read before the person's last edit)
    first = adapters.inspect_view(SlotForm(source=turbo, alpha="8"))
    assert first.alpha is KEEP and first.override is True and "alpha 8" in first.alpha_html
    again = adapters.inspect_view(SlotForm(source=turbo, alpha="1", info=info), previous=info)
    assert again.alpha is KEEP and again.override is KEEP


def test_the_result_caption_names_every_applied_setting_as_the_settings_json_does(events):
    """Audio ×0, a schedule, per-block strength and the step cache: the caption says each, in the words of the
    settings JSON's ``applied`` line (``summary.applied_words``), and the cache's count."""
    adapters, generate = events
    pick = adapters.pick_demo(str(TINY_DEMO_DIR / "tiny_style_warm.safetensors"))
    slot = SlotForm(source=pick.source, weight=pick.weight["value"],
                    advanced=AdvancedForm(audio_strength=0, strength_schedule="linear:1:0.5", block_strength="0:0.5"))
    session = with_adapter(None, "1", slot.settings("unmerged"))
    form = JobForm(session, "unmerged", RequestForm(prompt="a red ball", seed=1, cache=True, **{**FAST, "steps": 4}))
    view = generate.generate_view(form, progress=None)
    (line,) = view.settings_json["applied"]
    words = line.split(": ", 1)[1]
    for part in ("audio ×0", "schedule linear:1:0.5", "blocks 0:0.5"):
        assert part in words and part in view.result_html, part
    assert words in view.result_html
    cache = view.settings_json["result"]["cache"]
    assert f"step cache fbc: {cache['skipped']} of {cache['evaluations']} evaluations skipped" in view.result_html


def test_exact_parts_and_parts_left_out_are_named_in_the_applied_line():
    from h3app.adapters.summary import applied_words, parts_words
    from h3app.ui.presenters import render

    adapter = {"source": "fast.safetensors", "strength": 1.0, "alpha": None, "resolved_alpha": 4.0, "rank": 4,
               "parts": {"lora": 20, "diff": 3, "diff_b": 2, "set_weight": 1, "set_bias": 0, "head_bank": 32},
               "skipped_parts": {"adaln": 6}}
    assert parts_words(adapter) == "; exact parts: Δ 5 at the strength, 1 replacement, head bank of 32; left out: adaln 6"
    assert parts_words({"parts": {"lora": 20, "diff": 0}}) == ""  # pairs only: nothing more to say
    caption = render.result_html({"seed": 1, "adapters": [adapter], "cache": {"kind": "none"}})
    assert applied_words(adapter) in caption and "step cache" not in caption
