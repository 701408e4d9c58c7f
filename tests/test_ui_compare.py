"""The comparison view's values, the equivalence defaults, the grid layout and History's words — pure functions,
no model, no browser (tests/test_ui_compare_browser.py reads the same in chromium)."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import gradio as gr
import pytest
from gradio_client.utils import is_file_obj_with_meta

from h3app.rules.check_pair import DEFAULT_A, DEFAULT_B, default_pair
from h3app.rules.scale import effective_scale
from h3app.ui.compare.events import ComparisonEvents, alpha_in_use, column_settings
from h3app.ui.compare.layouts import grid_rows, grid_value, history_value, short_hash
from h3app.ui.compare.view import VIEW_CSS, VIEW_JS, ViewColumn, equal_marks, view_value
from h3app.ui.presenters import history_words
from h3app.ui.session import HistoryEntry


# ------------------------------------------------------------------------------------------- equivalence defaults
@pytest.mark.parametrize("alpha, rank, a, b", [
    (8.0, 128, (8.0, 1.0), (128.0, 0.0625)),  # LightX2V's rank-128 Turbo, exactly
    (1.0, 16, (1.0, 1.0), (16.0, 0.0625)),  # the tiny Turbo demo
    (32.0, 64, (32.0, 1.0), (64.0, 0.5)),
])
def test_default_pair_is_alpha_in_use_against_rank_at_alpha_over_rank(alpha, rank, a, b):
    first, second = default_pair(alpha, rank)
    assert (first.alpha, first.strength) == a and (second.alpha, second.strength) == b
    # the same effective scale, so an exact engine must give bit-identical outputs
    assert effective_scale(first.alpha, first.strength, rank) == effective_scale(second.alpha, second.strength, rank)


def test_default_pair_when_alpha_is_rank_or_unknown():
    a, b = default_pair(16.0, 16)  # A = B would test nothing
    assert (a.alpha, a.strength, b.alpha, b.strength) == (16.0, 1.0, 32.0, 0.5)
    assert default_pair(None, 16) == (DEFAULT_A, DEFAULT_B) == default_pair(4.0, None)


def test_check_pair_follows_the_adapter_and_names_the_real_factor():
    info = {"alpha": 1.0, "alpha_source": "registry", "rank": 16}
    view = ComparisonEvents.check_pair(info, False, "")
    assert (view.a_alpha, view.a_scale, view.b_alpha, view.b_scale) == (1.0, 1.0, 16.0, 0.0625)
    assert "the alpha in use, registry" in view.pair_note and "16× as strong as A" in view.pair_note
    typed = ComparisonEvents.check_pair(info, True, "4")  # the override is the alpha in use
    assert (typed.a_alpha, typed.b_alpha, typed.b_scale) == (4.0, 16.0, 0.25) and "4× as strong" in typed.pair_note
    assert alpha_in_use(info, True, "not a number") == (1.0, "registry")  # a bad box keeps the file's alpha
    assert ComparisonEvents.check_pair(None, False, "").a_alpha == DEFAULT_A.alpha
    assert "differ per module" in ComparisonEvents.check_pair({"alpha": None, "rank": None}, False, "").pair_note


# ----------------------------------------------------------------------------------------------------- the view
def test_view_value_sends_media_as_gradio_files_and_shows_every_column():
    value = view_value([ViewColumn("A", "A: alpha 1", "/out/a.mp4", audio="/out/a.wav"),
                        ViewColumn("B", "B: alpha 16", "/out/b.mp4", mark="= A")])
    assert value["show"] == [0, 1] and value["fps"] == 24.0 and value["run"]
    a, b = value["columns"]
    assert is_file_obj_with_meta(a["video"])  # what Gradio moves to its cache and serves
    assert gr.FileData(**a["video"]) == gr.FileData(path="/out/a.mp4", orig_name="a.mp4", mime_type="video/mp4")
    assert a["audio"]["mime_type"] == "audio/wav" and b["audio"] is None and b["mark"] == "= A"


def test_the_view_script_has_one_transport_and_pixel_exact_frames():
    for control in ("Play all", "Pause all", "previous frame", "next frame", "loop", "listen to", "A|B wipe", "blink"):
        assert control in VIEW_JS
    assert 'watch("value", render)' in VIEW_JS and "textContent" in VIEW_JS and "innerHTML" not in VIEW_JS
    assert "image-rendering: pixelated" in VIEW_CSS


def test_equal_marks_name_the_first_column_with_the_same_content():
    assert equal_marks(["α1×1", "α16×0.0625", "α16×1", "α1×0"], ["h1", "h1", "h2", "h0"], "h0") \
        == ["", "= α1×1", "", "= no LoRA"]


# ------------------------------------------------------------------------------------------------------ the grid
def cell(row, column, alpha, strength, digest, seed=7, psnr=30.0):
    return SimpleNamespace(row=row, column=column, alpha=alpha, strength=strength, seed=seed, hash=digest,
                           video_path=f"/out/{row}-{column}-{seed}.mp4", thumbnail_path=f"/out/{row}-{column}.png",
                           baseline_psnr=psnr, baseline_max_abs_diff=0.25, seconds=1.5,
                           baseline_video_path=f"/out/base-{seed}.mp4", baseline_thumbnail_path="/out/base.png",
                           baseline_hash="sha256:base")


def test_grid_value_has_headers_a_baseline_cell_and_equal_marks():
    cells = [cell(0, 0, 1.0, 0.0625, "sha256:aa"), cell(0, 1, 1.0, 1.0, "sha256:bb"),
             cell(1, 0, 16.0, 0.0625, "sha256:bb")]  # the last cell (α16 × 1) is still running
    value = grid_value(cells, (1.0, 16.0), (0.0625, 1.0), (7,), run="r1")
    (grid,) = value["grids"]
    assert grid["title"] == "seed 7" and grid["corner"] == "alpha ╲ scale" and grid["headers"] == ["× 0.0625", "× 1"]
    assert grid["rows"] == [{"header": "α 1", "cells": [1, 2]}, {"header": "α 16", "cells": [3, None]}]
    assert grid["baseline"] == 0 and value["columns"][0]["label"] == "no LoRA · seed 7"
    assert [c["mark"] for c in value["columns"]] == ["", "", "", "= α1×1"]
    assert value["show"] == [0, 3] and value["run"] == "r1"  # the baseline and the newest cell
    rows = grid_rows(cells)
    assert rows[2] == ["16", "0.0625", 7, "30.0", 0.25, 1.5, "bb", "α1×1"]


def test_grid_value_keeps_seeds_apart():
    cells = [cell(0, 0, None, 1.0, "sha256:a", seed=1), cell(0, 0, None, 1.0, "sha256:b", seed=2, psnr=math.inf)]
    value = grid_value(cells, (None,), (1.0,), (1, 2), run="r")
    assert [g["title"] for g in value["grids"]] == ["seed 1", "seed 2"]
    assert [c["key"] for c in value["columns"]] == ["no LoRA s1", "αauto×1 s1", "no LoRA s2", "αauto×1 s2"]
    assert value["columns"][3]["caption"] == "⚠ identical to no LoRA"
    assert grid_rows(cells)[1][3] == "∞"


# --------------------------------------------------------------------------------------------------- history
ADAPTER = {"source": "/demo/tiny_turbo_4step.safetensors", "weight_name": "tiny_turbo_4step.safetensors",
           "rank": 16, "stored_alpha": 1.0, "alpha_source": "registry", "alpha": None, "resolved_alpha": 1.0,
           "resolved_alpha_source": "registry", "strength": 1.0, "mode": "unmerged"}
REQUEST = {"prompt": "a red ball bouncing on a wooden floor", "seed": 7, "steps": 4, "duration": 1.0,
           "workflow": "t2va", "shift": None, "audio_shift": None, "height": 32, "width": 56}


def test_history_label_carries_prompt_seed_and_adapter_settings():
    assert history_words.entry_label("generate", {"request": REQUEST, "adapters": [ADAPTER]}) == (
        "generate · “a red ball bouncing on a wooden floor” · seed 7 · tiny_turbo_4step α 1 (registry) × 1")
    base = {"request": {**REQUEST, "prompt": "x" * 50}, "adapters": []}
    assert history_words.entry_label("grid", base) == f"grid · “{'x' * 40}…” · seed 7 · no LoRA"


def test_differences_are_in_words():
    settings = {"request": REQUEST, "adapter": ADAPTER}
    fallback = column_settings(settings, {"label": "fallback", "alpha": None, "strength": 1.0})
    generated = {"request": REQUEST, "adapters": [ADAPTER]}
    assert history_words.differences(fallback, generated) == [("alpha", "16 (rank fallback) → 1 (registry)")]
    typed = column_settings(settings, {"label": "B", "alpha": 16.0, "strength": 0.0625})
    assert history_words.differences(generated, typed) == [("alpha", "1 (registry) → 16 (typed)"),
                                                           ("scale", "1 → 0.0625")]
    other = {"request": {**REQUEST, "seed": 8, "shift": 5.0}, "adapters": []}
    assert history_words.differences(generated, other) == [
        ("seed", "7 → 8"), ("shift", "auto → 5"), ("adapter", "tiny_turbo_4step → none (no LoRA)"),
        ("alpha", "1 (registry) → —"), ("scale", "1 → —"), ("mode", "unmerged → —")]


def test_history_value_marks_equal_content():
    a = HistoryEntry(1, "check A", "check A", "/out/a.mp4", None, "sha256:0123456789abcdef", {})
    b = dataclasses.replace(a, number=2, kind="check B")
    value = history_value(a, b)
    assert [c["label"] for c in value["columns"]] == ["A: check A", "B: check B"]
    assert value["columns"][1]["mark"] == "= A" and value["columns"][0]["caption"] == "hash 0123456789ab"
    assert short_hash("sha256:0123456789abcdef") == "0123456789ab"
