"""The UI's pure parts: effective-scale readout, profile rescaling, copy-as-CLI texts, HTML escaping, session
settings and settings files. No model is loaded here."""

from __future__ import annotations

import json
import math

import gradio as gr
import pytest

from h3app.adapters.resolved import resolve_adapter
from h3app.errors import H3AppError
from h3app.lora.profile_rescale import profile_view, relative_updates
from h3app.settings import LoRASettings
from h3app.ui.forms import KEEP
from h3app.ui.generate.events import (
    apply_preset,
    steps_note,
    with_trigger,
    workflow_inputs,
)
from h3app.ui.generate.settings_file import load_settings_view, read_settings_file
from h3app.ui.presenters import render, snippets
from h3app.ui.session import (
    MAX_HISTORY,
    RunningJobs,
    add_history,
    job_adapters,
    new_session,
    parse_adapters_json,
    with_adapter,
)


def mixed_info(alpha_source: str = "rank_fallback", rslora: bool = False) -> dict:
    """An AdapterInfo.to_json()-shaped dict: 2 AdaLN targets at rank 2 and 3 attention targets at rank 8."""
    ranks = {"transformer_blocks.0.norm1.linear": 2, "transformer_blocks.1.norm1.linear": 2,
             "transformer_blocks.0.attn.to_q": 8, "transformer_blocks.0.attn.to_k": 8,
             "transformer_blocks.0.attn.to_v": 8}
    alphas = {t: float(r) for t, r in ranks.items()} if alpha_source == "rank_fallback" else {t: 4.0 for t in ranks}
    return {"format": "native", "suffix_style": "lora_A/B", "prefix": "", "rank": None, "ranks": ranks,
            "alpha": None if alpha_source == "rank_fallback" else 4.0, "alpha_source": alpha_source, "alphas": alphas,
            "alpha_sources": {t: alpha_source for t in ranks}, "num_targets": len(ranks), "targets": list(ranks),
            "dtype": "BF16", "file_bytes": 12345, "warnings": [], "hints": {}, "known": None, "use_rslora": rslora,
            "unmatched_keys": [], "reference_targets": []}


# ----------------------------------------------------------------------------------------------- effective scale
def scale_groups(info, alpha, strength):
    return resolve_adapter(info, alpha, strength).groups


def test_scale_groups_per_rank_follow_alpha_times_strength_over_rank():
    groups = scale_groups(mixed_info("metadata"), None, 0.5)
    assert [(g.rank, g.alpha, g.count) for g in groups] == [(2, 4.0, 2), (8, 4.0, 3)]
    assert [g.scale for g in groups] == [4.0 * 0.5 / 2, 4.0 * 0.5 / 8]


def test_scale_groups_override_replaces_alpha_and_rslora_divides_by_sqrt_rank():
    groups = scale_groups(mixed_info("metadata", rslora=True), 16.0, 1.0)
    assert {g.alpha_source for g in groups} == {"explicit"}
    assert [g.scale for g in groups] == [16.0 / math.sqrt(2), 16.0 / math.sqrt(8)]


def test_equivalence_pair_has_the_same_effective_scale_at_rank_128():
    info = {"ranks": {"t": 128}, "alphas": {"t": 128.0}, "alpha_sources": {"t": "rank_fallback"}}
    assert scale_groups(info, 8.0, 1.0)[0].scale == scale_groups(info, 128.0, 0.0625)[0].scale == 0.0625
    assert scale_groups(info, 8.0, 1.0)[0].rank_fallback_ratio == 16.0


def test_readout_warns_when_alpha_is_the_rank_guess_and_not_when_overridden():
    guess = render.readout_html(mixed_info(), None, 1.0)
    assert "h3-warn" in guess and "alpha is a guess" in guess
    explicit = render.readout_html(mixed_info(), 8.0, 1.0)
    assert "h3-ok" in explicit and "alpha is a guess" not in explicit
    assert "1 × 8 / 2" in explicit and "<b>4</b>" in explicit  # rank 2 at alpha 8: scale 4
    assert "h3-bad" in render.readout_html(mixed_info(), None, 1.0, problem="alpha must be > 0")


def test_alpha_card_names_the_factor_at_stake_for_a_rank_128_guess():
    info = {"ranks": {"t": 128}, "alphas": {"t": 128.0}, "alpha_sources": {"t": "rank_fallback"},
            "alpha_source": "rank_fallback", "alpha": 128.0}
    html = render.alpha_card(info, None)
    assert "a guess" in html and "16× too strong" in html
    assert "your override" in render.alpha_card(info, 8.0)


# --------------------------------------------------------------------------------------------- strength profile
def basis(source: str = "rank_fallback", update: float = 0.5) -> dict:
    targets = {}
    for block in range(2):
        for name, group, rank in (("attn.to_q", "attention", 8), ("ff.net.2", "feed_forward", 8),
                                  ("norm1.linear", "adaln", 2)):
            targets[f"transformer_blocks.{block}.{name}"] = {
                "block": f"transformer_blocks.{block}", "group": group, "rank": rank, "use_rslora": False,
                "chain_source": source, "update_norm": update * (block + 1), "weight_norm": 10.0}
    adapter = {"ranks": {t: v["rank"] for t, v in targets.items()},
               "alphas": {t: float(v["rank"]) for t, v in targets.items()},
               "alpha_sources": {t: source for t in targets}, "use_rslora": False}
    return {"targets": targets, "adapter": adapter, "group_strengths": {}, "usual_range": [1e-3, 1e-2]}


def test_profile_rescales_linearly_with_strength_and_alpha():
    b = basis()
    base = relative_updates(b, None, 1.0)
    doubled = relative_updates(b, None, 2.0)
    assert all(doubled[t] == pytest.approx(2 * base[t]) for t in base)
    at_alpha_one = relative_updates(b, 1.0, 1.0)
    # chain alpha = rank → scale 1; alpha 1 → scale 1/rank
    assert at_alpha_one["transformer_blocks.0.attn.to_q"] == pytest.approx(base["transformer_blocks.0.attn.to_q"] / 8)
    resolved = resolve_adapter(b["adapter"], 1.0, 1.0)  # the bars read the one resolution's scales
    assert at_alpha_one == {t: abs(resolved.scales[t]) * v["update_norm"] / v["weight_norm"]
                            for t, v in b["targets"].items()}
    halved_attention = relative_updates({**b, "group_strengths": {"attention": 0.5}}, None, 1.0)
    assert halved_attention["transformer_blocks.0.attn.to_q"] == base["transformer_blocks.0.attn.to_q"] / 2
    assert halved_attention["transformer_blocks.0.ff.net.2"] == base["transformer_blocks.0.ff.net.2"]
    view = profile_view(b, None, 1.0)
    assert {row["group"] for row in view.by_group} == {"attention", "feed-forward", "adaln"}
    assert [row["block"] for row in view.by_block] == ["block 0", "block 1"]


def test_profile_warning_only_for_an_unstored_alpha_on_auto_far_above_range():
    assert "no alpha stored" in profile_view(basis(), None, 1.0).warning
    assert profile_view(basis(), 0.001, 1.0).warning is None  # explicit alpha: the user decided
    assert profile_view(basis(source="metadata"), None, 1.0).warning is None  # alpha was stored
    assert profile_view(basis(update=1e-4), None, 1.0).warning is None  # plausible size


# ------------------------------------------------------------------------------------------------ copy as CLI
def settings_json(alpha=None, stored=None, source="module_tensor", strength=1.0, rank=4, second=False) -> dict:
    adapter = {"source": "owner/repo", "weight_name": "lora.safetensors", "revision": None, "commit": "a" * 40,
               "sha256": "b" * 64, "rank": rank, "stored_alpha": stored, "alpha_source": source, "alpha": alpha,
               "resolved_alpha": alpha if alpha is not None else stored,
               "resolved_alpha_source": "explicit" if alpha is not None else source, "strength": strength,
               "mode": "unmerged"}
    adapters = [adapter, {**adapter, "source": "other/repo", "alpha": None}] if second else [adapter]
    return {"model": "tiny", "request": {"prompt": "a fox's tail", "seed": 3, "steps": 5, "duration": 5.0,
                                         "height": 32, "width": 32, "shift": None, "audio_shift": 3.0,
                                         "workflow": "t2va", "first_frame": None, "last_frame": None,
                                         "references": []},
            "adapters": adapters}


def test_h3app_command_pins_the_commit_and_quotes_the_prompt():
    command = snippets.h3app_command(settings_json(alpha=8.0, second=True))
    assert "--prompt 'a fox'\"'\"'s tail'" in command
    assert f"--revision {'a' * 40}" in command and "--alpha 8" in command and "--scale 1" in command
    assert "--audio-shift 3" in command and "--height 32 --width 32" in command
    assert "--adapter-spec other/repo,weight=lora.safetensors,rev=" in command and "alpha=auto" in command


def test_sglang_integral_alpha_is_passed_and_no_note_about_alpha():
    result = snippets.sglang_command(settings_json(alpha=8.0, stored=None, source="rank_fallback"))
    assert "--lora-alpha 8" in result.command and "--lora-scale 1" in result.command
    assert "--lora-path owner/repo" in result.command and "--lora-weight-name lora.safetensors" in result.command
    assert not any("integer" in n or ".alpha tensors" in n for n in result.notes)


def test_sglang_compensates_truncated_module_alphas_that_win_over_the_override():
    info = {"alphas": {"a": 1.5, "b": 1.5}, "alpha_sources": {"a": "module_tensor", "b": "module_tensor"},
            "ranks": {"a": 4, "b": 4}}
    result = snippets.sglang_command(settings_json(alpha=8.0, stored=1.5), [info])
    # sglang runs int(1.5) = 1 from the tensors whatever --lora-alpha says: scale 8 gives h3app's 8 / 4 = 2.
    assert "--lora-alpha" not in result.command and "--lora-scale 8" in result.command


def test_sglang_fractional_explicit_alpha_becomes_the_exact_integer_equivalent():
    info = {"alphas": {"a": 4.0}, "alpha_sources": {"a": "rank_fallback"}, "ranks": {"a": 4}}
    result = snippets.sglang_command(settings_json(alpha=2.5, source="rank_fallback", strength=1.0), [info])
    assert "--lora-alpha 4" in result.command and "--lora-scale 0.625" in result.command
    assert any("integer" in n for n in result.notes)


def test_diffusers_snippet_exports_with_alpha_baked_in_and_is_valid_python():
    text = snippets.diffusers_snippet(settings_json(alpha=8.0))
    assert "python -m h3app export --adapter owner/repo" in text and "--alpha 8" in text
    compile(text, "<snippet>", "exec")
    assert "load_lora_weights" in text and "num_inference_steps=5" in text


# ----------------------------------------------------------------------------------------------------- render
def test_untrusted_key_names_and_metadata_are_escaped():
    info = mixed_info()
    info["unmatched_keys"] = ["<script>alert(1)</script>.lora_A.weight"]
    info["hints"] = {"ss_network_alpha": "<img src=x onerror=alert(1)>"}
    html = render.inspect_card(info, "<b>name</b>")
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<img" not in html and "&lt;b&gt;name&lt;/b&gt;" in html


def test_match_preview_and_report_are_loud_about_unmatched_keys():
    info = mixed_info()
    assert "h3-ok" in render.match_preview(info)
    info["unmatched_keys"] = ["x.lora_A.weight", "x.lora_B.weight"]
    assert "h3-warn" in render.match_preview(info) and "2 keys match nothing" in render.match_preview(info)
    info["num_targets"] = 0
    assert "h3-bad" in render.match_preview(info) and "Matches no layer" in render.match_preview(info)
    report = {"matched": [{"group": "attention"}] * 3, "unmatched_keys": ["k1"], "uncovered_targets": [],
              "mode": "unmerged", "warnings": []}
    assert "Partial match" in render.report_card(report)
    assert "Loaded: all 3 targets bound" in render.report_card({**report, "unmatched_keys": []})


def test_verdict_identical_and_different():
    column = {"alpha": 8.0, "strength": 1.0, "hash": "sha256:" + "0" * 64, "label": "A", "effective_scale": 2.0}
    result = {"identical": True, "control_identical": True, "a": column, "b": {**column, "alpha": 128.0},
              "max_abs_diff": 0.0, "fallback_max_abs_diff": 0.3, "effective_scale_a": 2.0, "effective_scale_b": 2.0,
              "effective_scale_fallback": 1.0}
    assert "IDENTICAL" in render.verdict_html(result)
    different = render.verdict_html({**result, "identical": False, "b": {**column, "hash": "sha256:" + "1" * 64},
                                     "max_abs_diff": 0.1})
    assert "DIFFERENT" in different and "h3-bad" in different
    assert "not deterministic" in render.verdict_html({**result, "control_identical": False})
    assert render.distance_text(math.inf).startswith("⚠ identical to no LoRA")


# ---------------------------------------------------------------------------------------------------- session
def test_adapters_json_for_sessionless_clients():
    assert parse_adapters_json("") is None
    assert parse_adapters_json("[]") == []
    adapters = parse_adapters_json('{"source": "owner/repo", "alpha": "auto", "scale": 0.5}')
    assert adapters == [LoRASettings("owner/repo", alpha=None, strength=0.5)]
    with pytest.raises(H3AppError, match="must be JSON"):
        parse_adapters_json("{source: x}")
    with pytest.raises(H3AppError, match="alpha must be a finite number > 0"):
        parse_adapters_json('[{"source": "owner/repo", "alpha": -1}]')
    with pytest.raises(H3AppError, match="need a \\\"source\\\""):
        LoRASettings.from_json({"alpha": 8})


def test_session_slots_and_history_are_copies_and_bounded():
    empty = new_session()
    one = with_adapter(empty, "2", LoRASettings("b/b", alpha=8.0))
    one = with_adapter(one, "1", LoRASettings("a/a", strength=0.5))
    assert empty == new_session() and set(one.adapters) == {"1", "2"}
    assert [a.source for a in job_adapters(one)] == ["a/a", "b/b"]
    assert {a.mode for a in job_adapters(one, "merged")} == {"merged"}
    assert job_adapters(with_adapter(one, "1", None)) == [LoRASettings("b/b", alpha=8.0)]
    session = empty
    for index in range(MAX_HISTORY + 5):
        session = add_history(session, kind="generate", label=f"run {index}", video=f"/out/{index}.mp4",
                              thumbnail=None, hash="h", settings={})
    assert len(session.history) == MAX_HISTORY
    assert session.history[0].number == 6 and session.history[-1].id == f"#{MAX_HISTORY + 5} run {MAX_HISTORY + 4}"
    assert session.entry(session.history[-1].id) is session.history[-1] and session.entry("#1 run 0") is None
    # Gradio tells a State's changes apart by hash: equal content hashes equal, a change does not
    assert hash(with_adapter(empty, "1", LoRASettings("a/a"))) == hash(with_adapter(new_session(), "1", LoRASettings("a/a")))
    assert hash(one) != hash(with_adapter(one, "2", None)) and hash(session) != hash(new_session())


def test_running_jobs_cancel_only_the_sessions_own_job():
    class Handle:
        label = "generate"
        cancelled = False

        def cancel(self) -> None:
            self.cancelled = True

    jobs, mine, theirs = RunningJobs(), Handle(), Handle()
    with jobs.track("me", mine), jobs.track("them", theirs):
        assert jobs.cancel("me") == "generate"
    assert mine.cancelled and not theirs.cancelled
    assert jobs.cancel("me") is None  # finished jobs are forgotten


# --------------------------------------------------------------------------------------------- settings files
def test_load_settings_restores_controls_from_json(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(settings_json(alpha=8.0, strength=0.25, second=True)))
    view = load_settings_view(str(path))
    request = view.request
    assert (request.workflow, request.prompt, request.seed) == ("t2va", "a fox's tail", 3) and request.steps == 5
    slot_1 = view.slots["1"]
    assert slot_1.source == "owner/repo" and slot_1.revision == "a" * 40 and slot_1.override is True
    assert slot_1.alpha == "8" and slot_1.strength == 0.25
    assert view.slots["2"].source == "other/repo" and view.slots["2"].override is False
    assert view.load_status == "Settings restored."


def test_load_settings_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(gr.Error) as error:
        load_settings_view(str(bad))
    assert "could not read settings" in error.value.message and "\n" not in error.value.message
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with pytest.raises(H3AppError, match="no \"request\""):
        read_settings_file(str(empty))


def test_steps_note_and_trigger_word_follow_the_known_adapter():
    known = {"known": {"title": "Turbo", "steps": 5, "trigger": "r34l1sm"}}
    assert "9 steps → 8 transformer evaluations" in steps_note(9, None)
    assert "made for **5 steps**" in steps_note(9, known)
    assert "made for" not in steps_note(5, known)
    assert with_trigger("a dog", known) == "r34l1sm, a dog"
    assert with_trigger("R34L1SM a dog", known) == "R34L1SM a dog"
    assert with_trigger("a dog", None) == "a dog"


def test_known_adapter_card_and_one_click_preset():
    known = {"title": "LightX2V H3 Turbo 4-step v0.1 (544p)", "steps": 5, "shift": 12.0, "audio_shift": 3.0,
             "scale": None, "workflow": "fl2va", "trigger": None, "alpha": 8.0, "notes": "<b>no alpha</b> in file"}
    card = render.known_card(known)
    assert "Known adapter: LightX2V H3 Turbo" in card and "steps 5" in card and "4 transformer evaluations" in card
    assert "&lt;b&gt;no alpha&lt;/b&gt;" in card
    preset = apply_preset({"known": known}, "a fox")
    scale, steps, shift, audio_shift, workflow, prompt = (preset.strength, preset.steps, preset.shift,
                                                          preset.audio_shift, preset.workflow, preset.prompt)
    assert (steps, shift, audio_shift, workflow, prompt) == (5, 12.0, 3.0, "fl2va", "a fox")
    assert scale is KEEP  # the registry gives no scale: the slider stays
    with pytest.raises(gr.Error, match="no preset to apply"):
        apply_preset({"known": None}, "a fox")


def test_a_preset_that_carries_a_prompt_sets_it_and_a_sample_button_puts_its_prompt_in_the_box():
    from h3app.adapters.known import find_known
    from h3app.rules.choices import TINY_REPO_ID
    from h3app.rules.request_defaults import TINY_DEFAULTS
    from h3app.ui.generate.events import sample_prompt

    turbo = find_known(TINY_REPO_ID, "tiny_turbo_4step.safetensors")
    assert turbo is not None and turbo.prompt
    preset = apply_preset({"known": turbo.to_json(), "alpha": None}, "a red fox running through fresh snow")
    assert preset.prompt == turbo.prompt and preset.steps == turbo.steps
    triggered = apply_preset({"known": {"trigger": "r34l1sm", "prompt": "a red ball moving up"}}, "a fox")
    assert triggered.prompt == "r34l1sm, a red ball moving up"  # its prompt, with its trigger word in front
    assert apply_preset({"known": {"steps": 9}}, "a fox").prompt == "a fox"  # no prompt in the preset: kept
    assert [sample_prompt(text) for text in TINY_DEFAULTS.sample_prompts] == list(TINY_DEFAULTS.sample_prompts)


def test_header_shows_the_hardware_line_from_the_planner():
    from types import SimpleNamespace

    from h3app.hardware.summary import hardware_line, remember
    from h3app.ui.app_ui import header_html

    backend = SimpleNamespace(hosted=False, model_name="MiniMaxAI/MiniMax-H3")
    options = SimpleNamespace(device="cuda", dtype="bfloat16", offload="auto", fp8=False)
    plan = SimpleNamespace(peak_gpu_bytes=72_600_000_000)
    remember("MiniMaxAI/MiniMax-H3", options, plan)  # what the entry point's pre-download plan records
    line = hardware_line("MiniMaxAI/MiniMax-H3", options, device=("NVIDIA H100 80GB HBM3", 85_000_000_000))
    html = header_html(backend, line)
    assert "NVIDIA H100" in html and "planned peak 72.6 GB" in html and "headroom 12.4 GB" in html
    cpu = header_html(backend, hardware_line("tiny", SimpleNamespace(device="cpu"), device=None))
    assert "CPU (no GPU)" in cpu
    assert "data-testid='hardware'" not in header_html(backend)


def test_workflow_inputs_show_each_workflows_own_uploads_by_name():
    assert [workflow_inputs(w).keyframes["visible"] for w in ("t2va", "fl2va", "ref2va")] == [False, True, False]
    assert [workflow_inputs(w).references["visible"] for w in ("t2va", "fl2va", "ref2va")] == [False, False, True]
