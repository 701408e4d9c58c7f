"""Nothing dropped without a word (issue 55, item 4): the keys of an adapter file a run does not apply are named —
how many, the first few, and why — by ``inspect``, ``generate`` (plain and ``--json``), ``check``, ``grid``, the
page's result and the API, all from the one ``adapters/not_applied.py`` object the run carries. A file none of whose
keys applies stays a refusal. Every file is written here: a kohya file with 24 ``lora_te_`` keys, a diffusers file
with 16 ``text_encoder.`` keys, a file with 12 keys of unknown modules, each beside real H3 keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from adapter_fixtures import TINY_SHAPES, diffusers_targets, factors, kohya_block, lora_keys, save
from cli_runner import run_cli

from h3app.adapters.inspect import inspect_file
from h3app.adapters.normalise import load_adapter
from h3app.adapters.not_applied import (
    NO_FACTORS,
    OTHER_MODEL,
    TEXT_ENCODER,
    UNKNOWN_MODULE,
    NotApplied,
    classify,
)
from h3app.errors import H3AppError
from h3app.rules.frames import RELEASED

FAST = ("--steps", "2", "--height", "16", "--width", "16")


def _kohya_with_text_encoder(folder: Path) -> tuple[Path, list[str]]:
    """kohya/musubi H3 keys for block 0 and 12 text-encoder modules × (lora_down, lora_up) = 24 ``lora_te_`` keys."""
    tensors = kohya_block(0, alpha=2.0)
    for layer in range(12):
        tensors.update(lora_keys(f"lora_te_text_model_encoder_layers_{layer}_self_attn_q_proj",
                                 *factors(8, 8, 4, seed=layer), "du"))
    return save(folder / "kohya_te.safetensors", tensors), sorted(k for k in tensors if k.startswith("lora_te_"))


def _diffusers_with_text_encoder(folder: Path) -> tuple[Path, list[str]]:
    """diffusers keys for two H3 targets and 8 ``text_encoder.`` modules × (lora_A, lora_B) = 16 keys."""
    tensors = diffusers_targets("transformer.", targets=("transformer_blocks.0.attn.to_q",
                                                         "transformer_blocks.0.attn.to_k"))
    for layer in range(8):
        tensors.update(lora_keys(f"text_encoder.text_model.encoder.layers.{layer}.self_attn.q_proj",
                                 *factors(8, 8, 4, seed=layer)))
    return save(folder / "diffusers_te.safetensors", tensors), sorted(k for k in tensors if "text_encoder" in k)


def _unknown_modules(folder: Path) -> tuple[Path, list[str]]:
    """One H3 target and 6 modules H3 does not have × (lora_A, lora_B) = 12 unknown-module keys."""
    tensors = diffusers_targets("", targets=("transformer_blocks.0.attn.to_q",))
    for index in range(6):
        tensors.update(lora_keys(f"transformer_blocks.0.mystery_{index}", *factors(8, 8, 4, seed=index)))
    return save(folder / "unknown.safetensors", tensors), sorted(k for k in tensors if "mystery" in k)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[str]]]:
    folder = tmp_path_factory.mktemp("not_applied")
    return {"kohya": _kohya_with_text_encoder(folder), "diffusers": _diffusers_with_text_encoder(folder),
            "unknown": _unknown_modules(folder)}


def _only_group(not_applied: dict, reason: str, keys: list[str]) -> None:
    """``not_applied`` (JSON) holds exactly ``keys``, all for ``reason``."""
    assert not_applied["count"] == len(keys)
    assert [g["reason"] for g in not_applied["reasons"]] == [reason]
    assert not_applied["reasons"][0]["keys"] == keys and not_applied["reasons"][0]["count"] == len(keys)


# ------------------------------------------------------------------------------------------- the one object
@pytest.mark.parametrize(("name", "reason", "count"), [("kohya", TEXT_ENCODER, 24), ("diffusers", TEXT_ENCODER, 16),
                                                       ("unknown", UNKNOWN_MODULE, 12)])
def test_inspect_names_every_key_left_out_and_why(files, name, reason, count):
    path, keys = files[name]
    info = inspect_file(path, shapes=TINY_SHAPES)
    assert len(keys) == count and info.num_targets > 0
    _only_group(info.to_json()["not_applied"], reason, keys)
    assert info.not_applied.text().startswith(f"{count} keys not applied: {count} ")
    assert keys[0] in info.not_applied.text() and keys[-1] not in info.not_applied.text()  # the first few only


def test_the_other_transformers_keys_and_lone_alphas_have_their_own_reason(tmp_path):
    """Keys for ``transformer_ref`` in a t2va run are for the other transformer (and the other way round); an
    ``.alpha`` without factors is said as such; the JSON round-trips."""
    tensors = {**diffusers_targets("transformer.", targets=("transformer_blocks.0.attn.to_q",)),
               **diffusers_targets("transformer_ref.", targets=("transformer_blocks.0.attn.to_k",))}
    path = save(tmp_path / "both.safetensors", tensors)
    ref_keys = sorted(k for k in tensors if k.startswith("transformer_ref."))
    main_keys = sorted(k for k in tensors if not k.startswith("transformer_ref."))
    _only_group(inspect_file(path, shapes=TINY_SHAPES).to_json()["not_applied"], OTHER_MODEL, ref_keys)
    on_ref = inspect_file(path, shapes=TINY_SHAPES, partition="transformer_ref").to_json()["not_applied"]
    _only_group(on_ref, OTHER_MODEL, main_keys)
    assert "transformer_ref" in inspect_file(path, shapes=TINY_SHAPES).not_applied.groups[0].why
    left = classify(["blocks.0.x.alpha", "foo.lora_A.weight", "foo.lora_B.weight", "foo.alpha"])
    assert [(g.reason, g.keys) for g in left.groups] == [
        (NO_FACTORS, ("blocks.0.x.alpha",)), (UNKNOWN_MODULE, ("foo.alpha", "foo.lora_A.weight", "foo.lora_B.weight"))]
    assert NotApplied.from_json(left.to_json()) == left and NotApplied.from_json(None).text() == ""


def test_a_file_whose_keys_all_miss_is_still_refused(tmp_path):
    tensors = {k: v for layer in range(2) for k, v in lora_keys(
        f"lora_te_text_model_encoder_layers_{layer}_self_attn_q_proj", *factors(8, 8, 4, seed=layer), "du").items()}
    with pytest.raises(H3AppError, match="names an H3 module"):
        load_adapter(save(tmp_path / "te_only.safetensors", tensors), shapes=TINY_SHAPES)


# ------------------------------------------------------------------------------------------------ every run
@pytest.mark.slow
def test_generate_json_and_its_summary_line_name_the_24_text_encoder_keys(files, capsys, tmp_path):
    path, keys = files["kohya"]
    args = ("generate", "--model", "tiny", "--prompt", "a red ball", *FAST, "--adapter", str(path))
    cli = run_cli(capsys, *args, "--out", str(tmp_path / "a.mp4"), "--json")
    assert cli.code == 0, cli.err
    result = json.loads(cli.out)
    _only_group(result["adapters"][0]["not_applied"], TEXT_ENCODER, keys)
    assert len(result["not_applied"]) == 1 and result["not_applied"][0].startswith("kohya_te: 24 keys not applied")
    plain = run_cli(capsys, *args, "--out", str(tmp_path / "b.mp4"))
    assert plain.code == 0, plain.err
    assert f"\n  {result['not_applied'][0]}" in plain.out and keys[0] in plain.out


@pytest.mark.slow
def test_check_and_grid_name_the_keys_they_left_out(files, capsys, tmp_path):
    path, keys = files["diffusers"]
    cli = run_cli(capsys, "check", "--model", "tiny", "--adapter", str(path), "--json")
    assert cli.code == 0, cli.err
    [line] = json.loads(cli.out)["not_applied"]
    assert line.startswith("diffusers_te: 16 keys not applied: 16 text-encoder keys") and keys[0] in line
    plain = run_cli(capsys, "check", "--model", "tiny", "--adapter", str(path))
    assert line in plain.out
    path, keys = files["unknown"]
    grid = run_cli(capsys, "grid", "--model", "tiny", "--adapter", str(path), "--prompt", "a red ball", *FAST,
                   "--alphas", "4", "--scales", "1", "--seeds", "1", "--out-dir", str(tmp_path / "grid"), "--json")
    assert grid.code == 0, grid.err
    result = json.loads(grid.out)
    assert result["not_applied"][0].startswith("unknown: 12 keys not applied: 12 keys that name no H3 module")
    _only_group(result["cells"][0]["adapter"]["not_applied"], UNKNOWN_MODULE, keys)


@pytest.mark.slow
def test_the_page_and_the_api_say_what_was_left_out(files, backend):
    from h3app.ui.adapter.events import AdapterEvents
    from h3app.ui.compare.events import ComparisonEvents
    from h3app.ui.forms import JobForm, RequestForm, SlotForm
    from h3app.ui.generate.events import GenerateEvents
    from h3app.ui.serving.api import ApiEvents
    from h3app.ui.session import RunningJobs, with_adapter

    jobs = RunningJobs()
    generate = GenerateEvents(backend, jobs)
    path, keys = files["kohya"]
    session = with_adapter(None, "1", SlotForm(source=str(path)).settings("unmerged"))
    view = generate.generate_view(JobForm(session, "unmerged", RequestForm(prompt="a red ball", seed=1, steps=2,
                                                                          height=16, width=16)), progress=None)
    [line] = view.settings_json["not_applied"]
    assert "not-applied" in view.result_html and "24 keys not applied" in view.result_html and keys[0] in line
    assert view.result_html.startswith('<div class="h3-card h3-warn"')  # said as a warning, not as all well
    api = ApiEvents(AdapterEvents(backend, jobs), generate, ComparisonEvents(backend, jobs))
    adapters_json = json.dumps([{"source": str(files["unknown"][0])}])
    _, answer = api.generate(None, "a red ball", seed=1, steps=2, duration=RELEASED.shortest_seconds, height=16,
                             width=16, shift=0, audio_shift=0, workflow="t2va", adapters_json=adapters_json,
                             progress=None)
    assert answer["not_applied"][0].startswith("unknown: 12 keys not applied")
    _only_group(answer["adapters"][0]["not_applied"], UNKNOWN_MODULE, files["unknown"][1])


@pytest.mark.slow
def test_the_full_check_and_its_verdict_name_the_keys_left_out(files, backend):
    """``check --mode full``, the API's /check_equivalence and the page's verdict read the check's ``not_applied``."""
    from h3app.request import GenerationRequest
    from h3app.settings import LoRASettings
    from h3app.ui.presenters import render

    path, keys = files["diffusers"]
    result = backend.check_equivalence(GenerationRequest(prompt="a red ball", seed=1, steps=2, height=16, width=16),
                                       LoRASettings(source=str(path))).to_json()
    [line] = result["not_applied"]
    assert line.startswith("diffusers_te: 16 keys not applied: 16 text-encoder keys") and keys[0] in line
    verdict = render.verdict_html(result)
    assert "data-testid='not-applied'" in verdict and "16 keys not applied" in verdict
