"""Declared sampling recipes (issue 55, item 6): FlashGen's ``base_schedule`` metadata, FastH3's
``adapter_manifest.json`` sampling block and FastH3 V2's ``fastvideo_inference.json`` are read (header and small
JSON files only), shown beside the registry's values with the one a run uses, and a disagreement is a warning;
``generate`` names each declared value its run did not follow. Every file is written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from adapter_fixtures import TINY_SHAPES, diffusers_targets, forbid_tensor_loads, save
from cli_runner import run_cli

from h3app.adapters.inspect import inspect_file
from h3app.adapters.recipe import INFERENCE_CONFIG, MANIFEST, declared_recipes
from h3app.ui.generate.events import steps_note
from h3app.ui.presenters import render

FASTH3_REPO = "FastVideo/FastVideo-FastH3-4-step-Preview-v1-LoRA"  # in the registry: 5 steps, shifts 12 / 3
TARGETS = ("transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k")


def adapter(folder: Path, metadata: dict[str, str] | None = None, **sidecars: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in sidecars.items():
        (folder / name.replace("__", ".")).write_text(json.dumps(content))
    return save(folder / "adapter.safetensors", diffusers_targets("", targets=TARGETS), metadata)


MANIFEST_KW = MANIFEST.replace(".", "__")
INFERENCE_KW = INFERENCE_CONFIG.replace(".", "__")


def test_flashgen_base_schedule_is_read_from_the_header_alone(tmp_path, monkeypatch):
    forbid_tensor_loads(monkeypatch)
    path = adapter(tmp_path, {"base_schedule": json.dumps([1.0, 0.9, 0.7, 0.4, 0.0])})
    recipe = inspect_file(path, shapes=TINY_SHAPES).to_json()["recipe"]
    [declared] = recipe["declared"]
    assert declared["steps"] == 5 and declared["sigmas"] == [1.0, 0.9, 0.7, 0.4, 0.0]
    steps = next(r for r in recipe["rows"] if r["field"] == "steps")
    assert steps["known"] is None and "model's default" in steps["used_from"]
    sigmas = next(r for r in recipe["rows"] if r["field"] == "sigmas")
    assert sigmas["used"] is None and "not applied" in sigmas["used_from"]


def test_fasth3_manifest_and_fastvideo_inference_config_beside_the_file(tmp_path):
    path = adapter(tmp_path / "v1", **{MANIFEST_KW: {"sampling": {"base_timesteps": [999, 749, 500, 250],
                                                                  "flow_shift": 12, "audio_flow_shift": 3}}})
    [declared] = inspect_file(path, shapes=TINY_SHAPES).to_json()["recipe"]["declared"]
    assert declared == {"source": MANIFEST, "steps": 5, "shift": 12.0, "audio_shift": 3.0,
                        "sigmas": [0.999, 0.749, 0.5, 0.25, 0.0]}
    path = adapter(tmp_path / "v2", **{INFERENCE_KW: {"num_inference_steps": 5, "flow_shift": 6}})
    [declared] = inspect_file(path, shapes=TINY_SHAPES).to_json()["recipe"]["declared"]
    assert (declared["source"], declared["steps"], declared["shift"], declared["sigmas"]) == (INFERENCE_CONFIG, 5,
                                                                                               6.0, None)


def test_a_recipe_that_agrees_with_the_registry_is_quiet_and_one_that_disagrees_is_a_warning(tmp_path):
    agreeing = adapter(tmp_path / "same", **{MANIFEST_KW: {"sampling": {"base_timesteps": [999, 749, 500, 250],
                                                                        "flow_shift": 12, "audio_flow_shift": 3}}})
    info = inspect_file(agreeing, shapes=TINY_SHAPES, repo_id=FASTH3_REPO, filename="adapter.safetensors")
    assert info.known is not None and info.recipe["warnings"] == []
    assert not any(r["disagrees"] for r in info.recipe["rows"])
    other = adapter(tmp_path / "other", **{MANIFEST_KW: {"sampling": {"num_inference_steps": 9, "flow_shift": 6}}})
    info = inspect_file(other, shapes=TINY_SHAPES, repo_id=FASTH3_REPO, filename="adapter.safetensors")
    rows = {r["field"]: r for r in info.recipe["rows"]}
    assert rows["steps"]["disagrees"] and rows["steps"]["used"] == 5 and rows["shift"]["used"] == 12.0
    [steps, shift] = info.recipe["warnings"]
    assert steps == (f"the file declares steps 9 ({MANIFEST}) but the registry says 5; a run uses 5, the registry's "
                     "preset (unless typed).")
    assert "shift 6" in shift and any(steps in w for w in info.warnings)  # among the inspect warnings too
    html = render.inspect_card(info.to_json())
    assert "data-testid='recipe'" in html and "9 steps" in html and "registry" in html
    note = steps_note(5, info.to_json())  # the page's note under Steps says what the file declares
    assert f"the adapter declares steps 9 ({MANIFEST}); Steps is 5" in note
    assert "declares" not in steps_note(9, info.to_json())


def test_malformed_recipes_are_left_out_and_a_changed_manifest_is_read_again(tmp_path):
    assert declared_recipes({"base_schedule": "[0.5, 0.7, 0]"}, {}) == ()  # not decreasing
    assert declared_recipes({"base_schedule": "not json"}, {MANIFEST: {"sampling": {"flow_shift": "x"}}}) == ()
    path = adapter(tmp_path)
    (tmp_path / MANIFEST).write_text("{broken")
    assert inspect_file(path, shapes=TINY_SHAPES).recipe["declared"] == []
    (tmp_path / MANIFEST).write_text(json.dumps({"sampling": {"num_inference_steps": 9}}))
    assert inspect_file(path, shapes=TINY_SHAPES).recipe["declared"][0]["steps"] == 9


@pytest.mark.slow
def test_generate_says_which_declared_values_its_run_did_not_follow(tmp_path, capsys):
    path = adapter(tmp_path, {"base_schedule": json.dumps([1.0, 0.9, 0.7, 0.4, 0.0])})
    cli = run_cli(capsys, "generate", "--model", "tiny", "--prompt", "a red ball", "--steps", "3", "--height", "16",
                  "--width", "16", "--adapter", str(path), "--out", str(tmp_path / "x.mp4"), "--json")
    assert cli.code == 0, cli.err
    result = json.loads(cli.out)
    assert result["recipe_notes"] == ["adapter: declares steps 5 (base_schedule (file metadata)); this run used 3"]
    assert result["adapters"][0]["recipe"]["declared"][0]["steps"] == 5
    cli = run_cli(capsys, "generate", "--model", "tiny", "--prompt", "a red ball", "--steps", "5", "--height", "16",
                  "--width", "16", "--adapter", str(path), "--out", str(tmp_path / "y.mp4"), "--json")
    assert cli.code == 0 and json.loads(cli.out)["recipe_notes"] == []  # followed: nothing to say
