"""The UI's event functions called directly, on a real ``Backend("tiny")`` with the demo adapters.

Generations use 2 steps on a 32×32 canvas to stay fast on two cores.
"""

from __future__ import annotations

import re
import threading
import warnings
from pathlib import Path

import gradio as gr
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from h3app.backend import media
from h3app.backend.service import DEMO_ADAPTERS_DIR, Backend
from h3app.ui.adapter.events import AdapterEvents, SourcePick, implied_weight
from h3app.ui.app_ui import header_html, launch_kwargs
from h3app.ui.compare.events import ComparisonEvents
from h3app.ui.forms import KEEP, CheckForm, GridForm, JobForm, RequestForm, SlotForm, SyncForm
from h3app.ui.generate.events import GenerateEvents, Stopped
from h3app.ui.generate.settings_file import load_settings_view
from h3app.ui.session import RunningJobs, Session, new_session

NO_ALPHA = str(DEMO_ADAPTERS_DIR / "lightx2v_turbo_no_alpha.safetensors")
KOHYA = str(DEMO_ADAPTERS_DIR / "kohya_musubi.safetensors")
RSLORA_FOLDER = str(DEMO_ADAPTERS_DIR / "peft_rslora")
FAST = {"steps": 2, "duration": 5.0, "height": 32, "width": 32}


class Request:
    """What Gradio hands an event: the session hash (events key their running job by it)."""

    def __init__(self, session_hash: str) -> None:
        self.session_hash = session_hash


@pytest.fixture(scope="module")
def backend():
    backend = Backend("tiny")
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def jobs():
    return RunningJobs()


@pytest.fixture(scope="module")
def adapters(backend, jobs):
    return AdapterEvents(backend, jobs)


@pytest.fixture(scope="module")
def generation(backend, jobs):
    return GenerateEvents(backend, jobs)


@pytest.fixture(scope="module")
def comparisons(backend, jobs):
    return ComparisonEvents(backend, jobs)


def slot(source: str, alpha=None, strength: float = 1.0, override: bool | None = None, weight=None) -> SlotForm:
    return SlotForm(source, weight, "", alpha is not None if override is None else override, alpha, strength, "auto")


def sync(adapters: AdapterEvents, first: SlotForm) -> Session:
    return adapters.sync_session(SyncForm(new_session(), "unmerged", {"1": first, "2": slot("")}))


def session_with(adapters: AdapterEvents, source: str, alpha: float | None = None, strength: float = 1.0) -> Session:
    return sync(adapters, slot(source, alpha, strength))


def job(session: Session, **request) -> JobForm:
    fields = {"workflow": "t2va", "prompt": "a fox", "seed": 3, **FAST, **request}
    return JobForm(session, "unmerged", RequestForm(**fields), "")


def generate(generation: GenerateEvents, session: dict, seed: int = 5, randomize: bool = False, **overrides):
    form = job(session, prompt="a fox in snow", seed=seed, randomize=randomize, **overrides)
    return generation.generate_view(form, request=Request("gen"), progress=None)


# ------------------------------------------------------------------------------------------------ inspect
def test_demo_choices_list_every_demo_adapter(adapters, backend):
    choices = adapters.demo_choices()
    assert [path for _, path in choices] == backend.demo_adapters()
    assert ("peft_rslora", RSLORA_FOLDER) in choices


def test_inspect_shows_format_rank_and_the_alpha_guess(adapters):
    view = adapters.inspect_view(slot(NO_ALPHA, weight="lightx2v_turbo_no_alpha.safetensors"), "", "t2va")
    info, card, alpha_card, readout, known, preset, targets, raw, alpha_box = (
        view.info, view.inspect_html, view.alpha_html, view.readout, view.known_html, view.known_box, view.targets,
        view.info_json, view.alpha)
    assert info["format"] == "peft" and info["alpha_source"] == "rank_fallback"
    assert "format peft" in card and f"{info['num_targets']} targets" in card
    assert "a guess" in alpha_card and "h3-warn" in alpha_card
    assert "h3-warn" in readout and "alpha is a guess" in readout
    assert alpha_box == f"{info['alpha']:g}" == str(info["rank"])  # the chain's value as the override's start
    assert known == "" and preset["visible"] is False
    assert isinstance(targets, pd.DataFrame) and targets["targets"].sum() == info["num_targets"]
    assert raw is info


def test_inspect_reads_alpha_from_the_files_alpha_tensors(adapters):
    view = adapters.inspect_view(slot(KOHYA, strength=2.0), "", "t2va")
    info, alpha_card, readout = view.info, view.alpha_html, view.readout
    assert info["alpha"] == 1.5 and info["alpha_source"] == "module_tensor"
    assert "alpha 1.5" in alpha_card and "the file&#x27;s .alpha tensors" in alpha_card and "h3-ok" in alpha_card
    assert f"{2.0 * 1.5 / info['rank']:.6g}" in readout  # strength × alpha / rank


def test_readout_follows_the_override_without_a_model_call(adapters):
    info = adapters.inspect(NO_ALPHA, None, None, None)
    shown = adapters.readout(info, slot(NO_ALPHA, 8.0))
    alpha_card, readout = shown.alpha_html, shown.readout
    assert "your override" in alpha_card
    assert f"{8.0 / info['rank']:.6g}" in readout and "alpha is a guess" not in readout
    problem = adapters.readout(info, slot(NO_ALPHA, "-1"))
    assert "h3-bad" in problem.readout and "alpha must be a finite number &gt; 0" in problem.alpha_html
    assert "alpha must be" not in problem.readout  # said once, in the alpha card
    typo = adapters.readout(info, slot(NO_ALPHA, "8x")).alpha_html
    assert "alpha must be a number such as 8" in typo


def test_inspect_errors_are_one_line_gradio_errors(adapters, tmp_path):
    with pytest.raises(gr.Error) as missing:
        adapters.inspect_view(slot(str(tmp_path / "nope.safetensors")), "", "t2va")
    assert "does not exist" in missing.value.message or "not found" in missing.value.message
    assert "\n" not in missing.value.message
    with pytest.raises(gr.Error, match="source is empty"):
        adapters.inspect("", None, None, None)
    pickle = tmp_path / "lora.ckpt"
    pickle.write_bytes(b"not really")
    with pytest.raises(gr.Error) as refused:
        adapters.inspect(str(pickle), None, None, None)
    assert "pickle" in refused.value.message


def test_listing_a_folder_and_implied_weight_names(adapters):
    update = adapters.list_weights(RSLORA_FOLDER)
    assert update["value"] == "adapter_model.safetensors"
    assert update["choices"][0][1] == "adapter_model.safetensors" and "kB" in update["choices"][0][0]
    assert implied_weight(RSLORA_FOLDER, "adapter_model.safetensors") is None
    assert implied_weight(NO_ALPHA, "lightx2v_turbo_no_alpha.safetensors") is None
    assert implied_weight("owner/repo", "lora.safetensors") == "lora.safetensors"
    assert adapters.list_weights("")["choices"] == []


def test_upload_copies_into_the_uploads_folder_and_hosted_mode_enforces_limits(adapters, backend, tmp_path):
    assert adapters.upload(None) == SourcePick() == adapters.pick_demo(None)  # nothing chosen: both boxes kept
    stored = adapters.upload(KOHYA)
    source, weight = stored.source, stored.weight
    assert Path(source).read_bytes() == Path(KOHYA).read_bytes()
    assert Path(backend.output_dir) in Path(source).parents and weight["value"] == "kohya_musubi.safetensors"
    text = tmp_path / "notes.txt"
    text.write_text("x")
    with pytest.raises(gr.Error, match="not a .safetensors file"):
        adapters.upload(str(text))
    hosted = Backend("tiny", hosted=True, max_remote_bytes=1000, loaded=backend.model, output_dir=tmp_path / "out")
    try:
        with pytest.raises(gr.Error, match="over this server's limit"):
            AdapterEvents(hosted).upload(KOHYA)
        small = tmp_path / "small.safetensors"
        save_file({"x.lora_A.weight": torch.zeros(1, 1)}, str(small))
        uploaded = AdapterEvents(hosted).upload(str(small)).source  # uploads land in an allowed folder
        assert Path(hosted.uploads_dir) in Path(uploaded).parents
        with pytest.raises(gr.Error, match="not a MiniMax-H3 LoRA"):  # read (allowed), then judged on its keys
            AdapterEvents(hosted).inspect(uploaded, None, None, None)
        with pytest.raises(gr.Error, match="not allowed on this server"):
            AdapterEvents(hosted).inspect(str(small), None, None, None)  # other local paths are refused
        assert "hosted mode" in header_html(hosted) and "local mode" in header_html(backend)
        served = launch_kwargs(hosted)
        assert served["max_file_size"] == 1000 and served["run_history"] is False
        assert served["allowed_paths"] == [str(tmp_path / "out")]
    finally:
        hosted.close()


# --------------------------------------------------------------------------------------------------- load
def test_an_upload_shows_its_file_name_and_keeps_its_server_path_in_state(backend, tmp_path):
    hosted = Backend("tiny", hosted=True, loaded=backend.model, output_dir=tmp_path / "out")
    try:
        events = AdapterEvents(hosted)
        view = events.upload_view(KOHYA)
        assert view.source == "upload: kohya_musubi.safetensors" and view.uploaded["shown"] == view.source
        assert Path(hosted.uploads_dir) in Path(view.uploaded["path"]).parents  # the path lives in state only
        assert view.weight["value"] == "kohya_musubi.safetensors"
        uploaded = SlotForm(view.source, view.weight["value"], uploaded=view.uploaded)
        assert uploaded.settings("unmerged").source == view.uploaded["path"]
        assert events.inspect_view(uploaded).info["rank"] > 0  # Inspect reads the file behind the name
        session = events.sync_session(SyncForm(new_session(), "unmerged", {"1": uploaded}))
        assert session.adapters["1"].source == view.uploaded["path"]
        typed = SlotForm("owner/repo", uploaded=view.uploaded)  # the box edited: what is typed counts
        assert typed.settings("unmerged").source == "owner/repo"
        with pytest.raises(gr.Error, match="not allowed on this server"):  # the label alone names no file
            events.inspect_view(SlotForm(view.source))
        assert events.upload_view(None) is None
    finally:
        hosted.close()


def test_load_binds_reports_and_draws_a_rescalable_profile(adapters):
    view = adapters.load_view(new_session(), "1", slot(NO_ALPHA), "unmerged", "t2va", "", request=Request("load"))
    session, info, report, basis, group_bars, block_bars, note, box = (
        view.session, view.info, view.report_html, view.basis, view.group_plot, view.block_plot, view.profile_html,
        view.profile_box)
    assert session.adapters["1"].source == NO_ALPHA and session.adapters["1"].alpha is None
    assert "Loaded: all" in report and "0 keys unmatched" in report and "sha256" in report
    assert len(basis["targets"]) == info["num_targets"] and box["visible"] is True
    assert set(basis["targets"]) == set(basis["adapter"]["ranks"])  # every bar has the resolved adapter's scale
    by_group, by_block = group_bars["value"], block_bars["value"]
    assert set(by_group["group"]) <= {"attention", "feed-forward", "adaln", "refiner", "input-output"}
    assert group_bars["y_lim"][0] == 0 and group_bars["y_lim"][1] > by_group["relative update"].max()
    assert not by_block.empty and "no alpha stored" in note  # random demo factors at alpha = rank: implausible
    twice = adapters.profile(basis, slot(NO_ALPHA, strength=2.0)).group_plot["value"]
    assert list(twice["relative update"]) == pytest.approx(list(2 * by_group["relative update"]))
    bars = adapters.profile(basis, slot(NO_ALPHA, 8.0))
    at_alpha_8, calm = bars.group_plot, bars.profile_html
    assert "no alpha stored" not in calm
    assert list(at_alpha_8["value"]["relative update"]) == pytest.approx(
        list(by_group["relative update"] * 8 / info["rank"]))


def test_load_partial_match_is_a_visible_warning(adapters, tmp_path):
    tensors = load_file(str(DEMO_ADAPTERS_DIR / "peft_diffusers_metadata.safetensors"))
    tensors["transformer.not_a_layer.lora_A.weight"] = torch.zeros(4, 8)
    tensors["transformer.not_a_layer.lora_B.weight"] = torch.zeros(8, 4)
    partial = tmp_path / "partial.safetensors"
    save_file(tensors, str(partial))
    preview = adapters.inspect_view(slot(str(partial)), "", "t2va").inspect_html
    assert "2 keys match nothing" in preview
    with pytest.warns(UserWarning, match="partial match: 2 adapter keys matched nothing"):  # the gr.Warning toast
        report = adapters.load_view(new_session(), "1", slot(str(partial)), "unmerged", "t2va", "",
                                    request=Request("load")).report_html
    assert "Partial match" in report and "2 keys matched NOTHING" in report
    assert "transformer.not_a_layer.lora_A.weight" in report


def test_load_with_zero_matches_is_an_error(adapters, tmp_path):
    nothing = tmp_path / "nothing.safetensors"
    save_file({"transformer.not_a_layer.lora_A.weight": torch.zeros(4, 8),
               "transformer.not_a_layer.lora_B.weight": torch.zeros(8, 4)}, str(nothing))
    with pytest.raises(gr.Error) as error:
        adapters.load_view(new_session(), "1", slot(str(nothing)), "unmerged", "t2va", "", request=Request("load"))
    assert "none of its 2 keys" in error.value.message and "\n" not in error.value.message


def test_sync_session_refuses_a_bad_alpha_with_the_slot_named(adapters):
    with pytest.raises(gr.Error) as error:
        sync(adapters, slot(NO_ALPHA, -2.0))
    assert error.value.message.startswith("adapter 1: alpha must be a finite number > 0")
    with pytest.raises(gr.Error, match="Override alpha is ticked but no alpha"):
        sync(adapters, slot(NO_ALPHA, None, override=True))


# ----------------------------------------------------------------------------------------------- generate
def test_generate_writes_back_a_random_seed_and_shows_how_to_reproduce(adapters, generation):
    session = session_with(adapters, NO_ALPHA, alpha=8.0)
    view = generate(generation, session, randomize=True)
    video, seed, settings, result, h3app, sglang, notes, snippet, session = (
        view.video, view.seed, view.settings_json, view.result_html, view.h3app_command, view.sglang_command,
        view.sglang_notes, view.diffusers_snippet, view.session)
    assert Path(video).is_file() and media.read_settings(video)["hash"] == settings["hash"]
    assert settings["request"]["seed"] == seed and 0 <= seed < 2**31
    adapter = settings["adapters"][0]
    assert adapter["resolved_alpha"] == 8.0 and adapter["resolved_alpha_source"] == "explicit"
    assert len(adapter["sha256"]) == 64 and "commit" in adapter
    assert settings["result"]["evaluations"] == 1 and "out" not in settings["result"]
    assert f"seed {seed}" in result and "alpha 8 (typed) × scale 1 → effective 0.0625" in result
    assert f"--seed {seed}" in h3app and "--alpha 8" in h3app
    assert "--lora-alpha 8" in sglang and "sglang serves the real weights" in notes
    assert "load_lora_weights" in snippet
    assert session.history[-1].video == video and session.history[-1].hash == settings["hash"]

    restored = load_settings_view(video)  # "load settings" from the mp4 it just made
    first = restored.slots["1"]
    assert restored.request.seed == seed and first.source == NO_ALPHA and first.override is True and first.alpha == "8"


def test_generate_request_errors_are_gradio_errors(adapters, generation):
    with pytest.raises(gr.Error, match="the prompt is empty"):
        generation.generate_view(job(new_session(), prompt="  ", seed=1), request=Request("gen"), progress=None)
    with pytest.raises(gr.Error, match="fl2va needs a first and/or last keyframe"):
        generation.generate_view(job(new_session(), workflow="fl2va", seed=1), request=Request("gen"), progress=None)


def test_cancel_stops_the_running_generation_and_the_next_one_runs(generation, backend):
    started = threading.Event()
    cancelled: list[str] = []

    def progress(value, desc=None, unit=None):
        if isinstance(value, tuple) and not started.is_set():
            started.set()
            cancelled.append(generation.runner.cancel(Request("canceller-is-this-session")))

    request = Request("canceller-is-this-session")
    fields = {**FAST, "steps": 4}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no pop-up (gr.Warning) repeats the tab's line
        result = generation.generate_view(job(new_session(), seed=1, **fields), request=request, progress=progress)
    assert isinstance(result, Stopped)  # no result shown: the run stopped, and the tab says so
    assert re.fullmatch(r"\*\*Cancelled after \d+ of 3 steps\.\*\* \(generation\)", result.status)  # a first run:
    # no "result from the previous run" where there is none; after one, the tab says it still shows it
    earlier = generate(generation, new_session(), seed=1).session
    assert result.after(earlier, "generate").status.endswith("The result shown is from the previous run.")
    assert result.after(earlier, "check") == result
    assert cancelled and cancelled[0].startswith("Cancelling **generate**")
    assert generation.runner.cancel(request) == "Nothing of yours is running."
    after = generate(generation, new_session(), seed=1)
    assert Path(after.video).is_file()


# -------------------------------------------------------------------------------------------- comparisons
@pytest.mark.slow
def test_equivalence_tab_says_identical_and_shows_the_fallback(adapters, comparisons):
    session = session_with(adapters, KOHYA)
    view = comparisons.check_view(job(session), CheckForm(8, 1.0, 128, 0.0625), request=Request("eq"), progress=None)
    verdict, shown, heat, heat_f, plot, spec, spec_f, data, session = (
        view.verdict, view.view, view.heat_ab, view.heat_fallback, view.psnr_plot, view.spectrogram_ab,
        view.spectrogram_fallback, view.result_json, view.session)
    assert "IDENTICAL" in verdict and data["identical"] and data["control_identical"]
    assert data["hash_a"] == data["hash_b"] != data["hash_fallback"]
    # one view plays all three columns, each with its own soundtrack (a WAV pulled out of its mp4)
    columns = shown["columns"]
    assert [c["key"] for c in columns] == ["A", "B", "fallback"] and shown["show"] == [0, 1, 2]
    media_files = [c[kind]["path"] for c in columns for kind in ("video", "audio")]
    assert all(Path(p).is_file() for p in (*media_files, heat, heat_f, spec, spec_f))
    assert [Path(c["audio"]["path"]).suffix for c in columns] == [".wav"] * 3
    assert all(c["video"]["meta"]["_type"] == "gradio.FileData" for c in columns)
    assert [c["mark"] for c in columns] == ["", "= A", ""]  # B's content is A's; the fallback's is not
    cap_b = columns[1]["label"]
    assert set(plot["pair"]) == {"A vs B", "A vs fallback"}
    assert plot[plot["pair"] == "A vs B"]["PSNR (dB)"].eq(100.0).all()  # identical frames at the ceiling
    assert plot[plot["pair"] == "A vs fallback"]["PSNR (dB)"].lt(100.0).any()
    assert "alpha 128 × scale 0.0625" in cap_b and "check A" in session.history[-2].kind
    cost = comparisons.check_estimate(RequestForm(prompt="a fox", steps=2, height=32, width=32))
    # timed: a generation has run on this backend at this size (the check's A run): the one estimator's words
    assert "costs **3 generations + 1 denoising step** (" in cost and "— about **" in cost
    assert "measured here: a run at this size took" in cost


def test_equivalence_needs_an_adapter_and_valid_settings(comparisons, adapters):
    with pytest.raises(gr.Error, match="needs an adapter"):
        comparisons.check_view(job(new_session()), CheckForm(8, 1.0, 128, 0.0625), request=Request("eq"),
                               progress=None)
    with pytest.raises(gr.Error, match="setting B"):
        comparisons.check_view(job(session_with(adapters, KOHYA)), CheckForm(8, 1.0, -128, 0.0625),
                               request=Request("eq"), progress=None)


@pytest.mark.slow
def test_grid_fills_cell_by_cell_and_flags_a_do_nothing_cell(adapters, comparisons):
    estimate = comparisons.estimate(GridForm("8", "1", "7"))
    assert "time unknown" in estimate or "about" in estimate
    assert comparisons.estimate(GridForm("8, x", "1", "7")).startswith("✖ alphas must be comma-separated")
    session = session_with(adapters, KOHYA)
    steps = list(comparisons.grid_view(job(session), GridForm("auto", "0, 1", "3"), request=Request("grid"),
                                       progress=None))
    assert len(steps) == 3  # one yield per cell, then the final one with the session
    last = steps[-1]
    shown, table, status, final_session, cells = last.view, last.table, last.status, last.session, last.cells
    assert len(table) == 2 and len(cells) == 2
    # the view: the baseline as a column of its own, then the cells under "× scale" headers in the row "α auto"
    (grid,) = shown["grids"]
    assert grid["title"] == "seed 3" and grid["headers"] == ["× 0", "× 1"]
    assert grid["rows"] == [{"header": "α auto", "cells": [1, 2]}] and grid["baseline"] == 0
    assert [c["key"] for c in shown["columns"]] == ["no LoRA", "αauto×0", "αauto×1"]
    assert Path(shown["columns"][0]["video"]["path"]).is_file() and shown["show"] == [0, 2]
    assert shown["columns"][1]["mark"] == "= no LoRA" and shown["columns"][2]["mark"] == ""
    assert list(table["equal to"]) == ["no LoRA", ""] and list(table["PSNR dB"])[0] == "∞"
    zero, one = cells
    assert zero["strength"] == 0.0 and zero["baseline_psnr"] == "inf"  # scale 0 is no LoRA: flagged
    assert one["strength"] == 1.0 and one["baseline_psnr"] != "inf"
    assert "1 cell is identical to no LoRA" in status and "Done: 2 cells." in status
    assert [h.kind for h in final_session.history[-2:]] == ["grid", "grid"]
    assert steps[0].session is KEEP  # the session is written once, at the end


def test_history_compare_names_the_settings_that_differ(adapters, generation, comparisons):
    session = session_with(adapters, KOHYA)
    session = generate(generation, session, seed=11).session
    session = generate(generation, session, seed=12).session
    history = comparisons.history_view(session)
    gallery, table, pick_a, pick_b = history.gallery, history.table, history.pick_a, history.pick_b
    assert len(gallery) == 2 and len(table) == 2
    # labels tell the two apart: prompt, seed and the adapter's alpha (with its source) and scale
    newest, older = list(table["result"])
    assert newest == "generate · “a fox in snow” · seed 12 · kohya_musubi α 1.5 (.alpha tensors) × 1"
    assert older == newest.replace("seed 12", "seed 11")
    assert pick_b["value"] == session.history[-1].id and pick_a["value"] == session.history[0].id
    assert pick_b["choices"][0] == (f"#2 {newest}", session.history[-1].id)
    shown = comparisons.compare(session, pick_a["value"], pick_b["value"])
    view, verdict, differences = shown.view, shown.verdict, shown.differences
    assert [Path(c["video"]["path"]).is_file() for c in view["columns"]] == [True, True]
    assert view["columns"][1]["label"] == f"B: {newest}"
    assert "DIFFERENT" in verdict and "PSNR" in verdict
    assert list(differences.itertuples(index=False, name=None)) == [("seed", "11 → 12")]
    same = comparisons.compare(session, pick_a["value"], pick_a["value"]).verdict
    assert "IDENTICAL" in same
    with pytest.raises(gr.Error, match="pick two results"):
        comparisons.compare(session, "#99 nothing", pick_a["value"])


def test_cancel_stops_a_running_grid_between_steps(adapters, comparisons, generation):
    calls: list[str | None] = []

    def progress(value, desc=None, unit=None):
        if desc and desc.startswith("grid:") and not calls:  # the grid's first step report
            calls.append(generation.runner.cancel(Request("grid-canceller")))

    session = session_with(adapters, KOHYA)
    steps = list(comparisons.grid_view(job(session, steps=3), GridForm("1, 2, 4", "0.5, 1", "3"),
                                       request=Request("grid-canceller"), progress=progress))
    assert calls and calls[0] == "Cancelling **grid**: it stops at its next step; the model is left unchanged."
    assert steps[-1].status.startswith("**Cancelled after") and "cells done).** (grid)" in steps[-1].status
    assert "previous run" not in steps[-1].status  # the grid shows this run's cells, not an earlier grid
    assert len(steps[-1].cells) < 6  # stopped before the sixth cell
    assert Path(generate(generation, new_session(), seed=2).video).is_file()  # the worker serves on


@pytest.mark.slow
def test_a_cancelled_check_counts_each_runs_own_steps_once(adapters, comparisons, generation):
    """The status line gives where each column stopped in its own run's steps (as the previews count them), not
    the whole check's total beside a per-run count in the preview note."""
    from h3app.backend.preview import PreviewBoard
    from h3app.ui.compare.events import Stopped

    calls: list[str | None] = []

    def progress(value, desc=None, unit=None):
        if isinstance(value, tuple) and value[0] >= 2 and not calls:
            calls.append(generation.runner.cancel(Request("check-canceller")))

    board = PreviewBoard()
    views = list(comparisons.check_views(job(session_with(adapters, KOHYA), steps=4), CheckForm(8, 1.0, 128, 0.0625),
                                         Request("check-canceller"), progress, board))
    stopped = views[-1]
    assert calls and isinstance(stopped, Stopped)
    assert re.fullmatch(r"\*\*Cancelled\*\* \(equivalence check\): fallback \(alpha = rank\) after \d of 3"
                        r"( steps; A, B not started| steps; .*not started|, A after \d of 3 steps; B not started)\.",
                        stopped.status), stopped.status


def test_the_grid_tab_and_the_cli_parse_seeds_alike(comparisons):
    from h3app.cli import build_parser
    from h3app.errors import H3AppError

    with pytest.raises(H3AppError, match="whole number, got '1.5'"):
        comparisons.plan(GridForm(seeds="0, 1.5"))  # the UI used to cut it to 1
    argv = ["grid", "--prompt", "x", "--adapter", "a.safetensors", "--out-dir", "d"]
    with pytest.raises(H3AppError, match="whole number, got '1.5'"):
        build_parser().parse_args([*argv, "--seeds", "0,1.5"])  # refused as the page refuses it
    assert list(comparisons.plan(GridForm(seeds="3; 0")).seeds) == build_parser().parse_args([*argv, "--seeds", "3,0"]).seeds
