"""What inspection says about every kind of H3 adapter people publish beyond plain A/B pairs (FastH3's exact deltas,
its VSA gates, PDD's head bank, Ref2VA files, pruned-base files), and what it refuses, from the header alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from adapter_fixtures import TINY_CONFIG, TINY_SHAPES, save
from cli_runner import assert_one_line, run_cli
from extra_parts_fixtures import (
    BANK_SIZE,
    BOUNDARY,
    FASTH3_METADATA,
    NORM_DELTAS,
    PRUNED_WIDTH,
    block_pairs,
    fasth3_tensors,
    pdd_tensors,
    pruned_tensors,
    vsa_tensors,
)

from h3app.adapters.inspect import inspect_file
from h3app.adapters.normalise import load_adapter
from h3app.adapters.parameters import parameter_shapes
from h3app.errors import H3AppError
from h3app.rules.choices import FL2VA, REF2VA
from h3app.rules.h3_modules import FULL_SIZE_CONFIG, transformer_shapes

PAIRS = len(block_pairs()) // 2  # 2 main blocks × 7 + 2 refiner blocks × 6


@pytest.mark.parametrize("config", [TINY_CONFIG, FULL_SIZE_CONFIG], ids=["tiny", "full-size"])
def test_the_parameter_table_is_the_models(config: dict) -> None:
    from diffusers import MiniMaxH3Transformer3DModel

    with torch.device("meta"):
        model = MiniMaxH3Transformer3DModel(**config)
    real = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert parameter_shapes(transformer_shapes(config)) == real


def test_fasth3_parts_are_counted_and_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save(tmp_path / "fasth3_dense.safetensors", fasth3_tensors(), FASTH3_METADATA)
    info = inspect_file(path, shapes=TINY_SHAPES)
    diffs, diff_bs = len(BOUNDARY) + len(NORM_DELTAS), len(BOUNDARY) + TINY_SHAPES.num_layers
    assert dict(info.parts) == {"lora": PAIRS, "diff": diffs, "diff_b": diff_bs, "set_weight": 0, "set_bias": 0,
                                "head_bank": 0}
    assert info.partition is None and info.unmatched_keys == ()
    assert (info.alpha, str(info.alpha_source), info.warnings) == (4.0, "metadata", ())  # its format: W + B@A
    code, out, err = run_cli(capsys, "inspect", str(path), "--model", "tiny", "--json")
    assert code == 0 and err == ""
    payload = json.loads(out)
    assert payload["parts"] == dict(info.parts) and payload["partition"] is None
    code, out, _ = run_cli(capsys, "inspect", str(path))
    assert f"A/B {PAIRS} pairs ({2 * PAIRS} tensors), Δ {diffs + diff_bs} (diff {diffs}, diff_b {diff_bs}), " \
           "replacements 0\n" in out
    assert "partition    unknown" in out


def test_vsa_gates_are_refused_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save(tmp_path / "fasth3_vsa.safetensors", vsa_tensors(), FASTH3_METADATA)
    code, out, err = run_cli(capsys, "inspect", str(path))
    assert code == 2 and out == ""
    assert_one_line(err, r"to_gate_compress.*needs the VSA attention backend")


def test_pdd_bank_and_bare_factors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save(tmp_path / "MiniMax-H3-FL2VA-Acc-8Step.safetensors", pdd_tensors())
    info = inspect_file(path, shapes=TINY_SHAPES)
    assert info.parts["lora"] == PAIRS and info.parts["head_bank"] == BANK_SIZE
    assert info.head_bank_modules == ("proj_out", "audio_proj_out") and info.unmatched_keys == ()
    assert info.partition == FL2VA and info.partition_source == "file_name"
    code, out, _ = run_cli(capsys, "inspect", str(path), "--model", "tiny")
    assert code == 0 and f"head bank {BANK_SIZE} × 2" in out and "partition    fl2va (from its file name" in out
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    bank = adapter.banks["proj_out"]
    assert tuple(bank.weight.shape) == (BANK_SIZE, 16, 24) and tuple(bank.bias.shape) == (BANK_SIZE, 16)
    assert len(adapter.modules) == PAIRS  # bare lora_down/lora_up (no .weight) bind like any pair


def test_a_bank_that_does_not_fit_is_refused(tmp_path: Path) -> None:
    tensors = pdd_tensors()
    tensors["proj_out.weight"] = torch.zeros(BANK_SIZE, 16, 20)
    tensors["proj_out.bias"] = torch.zeros(BANK_SIZE, 16)
    with pytest.raises(H3AppError, match=r"proj_out head bank has heads of \[16, 20\], the model's head is \[16, 24\]"):
        inspect_file(save(tmp_path / "pdd.safetensors", tensors), shapes=TINY_SHAPES)


@pytest.mark.parametrize(("name", "metadata", "expected", "source"), [
    ("MiniMax-H3-Ref2VA-Acc-8Step.safetensors", {}, REF2VA, "file_name"),
    ("minimax_h3_ref2v_turbo_8step.safetensors", {}, REF2VA, "file_name"),
    ("minimax_h3_fl2v_turbo_8step.safetensors", {}, FL2VA, "file_name"),
    ("plain.safetensors", {"task": "ref2va"}, REF2VA, "file_metadata"),
    ("ref2v_named.safetensors", {"partition": "transformer"}, FL2VA, "file_metadata"),  # metadata before the name
    ("plain.safetensors", {}, None, None),
])
def test_partition_from_metadata_then_name(tmp_path: Path, name: str, metadata: dict, expected: str | None,
                                           source: str | None) -> None:
    info = inspect_file(save(tmp_path / name, block_pairs(), metadata), shapes=TINY_SHAPES)
    assert (info.partition, info.partition_source) == (expected, source)


def test_a_ref2va_file_is_refused_for_the_main_partition(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save(tmp_path / "MiniMax-H3-Ref2VA-Acc-8Step.safetensors", pdd_tensors())
    info = inspect_file(path, shapes=TINY_SHAPES)  # inspect names it, loading refuses it
    assert any("is a Ref2VA adapter" in w and "--any-partition" in w for w in info.warnings)
    with pytest.raises(H3AppError, match=r"Ref2VA adapter \(its file name says so\): it binds only to the ref2va"):
        load_adapter(path, shapes=TINY_SHAPES)
    assert load_adapter(path, shapes=TINY_SHAPES, any_partition=True).banks
    assert load_adapter(path, shapes=TINY_SHAPES, partition="transformer_ref").banks
    fl2va = save(tmp_path / "MiniMax-H3-FL2VA-Acc-8Step.safetensors", pdd_tensors())
    with pytest.raises(H3AppError, match="FL2VA adapter.*binds only to the t2va and fl2va"):
        load_adapter(fl2va, shapes=TINY_SHAPES, partition="transformer_ref")
    code, out, _ = run_cli(capsys, "inspect", str(path), "--json")
    assert code == 0 and json.loads(out)["partition"] == REF2VA


def test_a_pruned_base_file_is_refused_then_applies_without_its_adaln_parts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save(tmp_path / "style_pruned.safetensors", pruned_tensors())
    adaln = 2 * TINY_SHAPES.num_layers  # a pair and a .diff_b per block
    other = PAIRS - TINY_SHAPES.num_layers
    code, out, err = run_cli(capsys, "inspect", str(path), "--model", "tiny")
    assert code == 2
    assert_one_line(err, rf"built for a pruned H3 checkpoint.*{PRUNED_WIDTH}-wide.*is 16 wide.*its {adaln} AdaLN parts "
                         rf"cannot bind; add --skip-parts adaln to apply the other {other} parts")
    code, out, _ = run_cli(capsys, "inspect", str(path), "--model", "tiny", "--skip-parts", "adaln", "--json")
    payload = json.loads(out)
    assert code == 0 and payload["skipped_parts"] == {"lora": 2, "diff_b": 2}
    assert payload["parts"]["lora"] == other and payload["parts"]["diff_b"] == 0
    assert not any("adaln" in t for t in payload["targets"])
    warned = inspect_file(path)  # no model: the full-size H3 is only a warning
    assert any("pruned H3 checkpoint" in w for w in warned.warnings)
    adapter = load_adapter(path, shapes=TINY_SHAPES, skip_parts=("adaln",))
    assert adapter.parts == {} and len(adapter.modules) == len(payload["targets"])
    with pytest.raises(H3AppError, match="--skip-parts 'norms' is not a part kind"):
        load_adapter(path, shapes=TINY_SHAPES, skip_parts=("norms",))


@pytest.mark.parametrize(("tensors", "fragment"), [
    ({"proj_in.set_weight": torch.zeros(24, 16), "transformer.proj_in.set_weight": torch.zeros(24, 16)},
     "two replacements of one parameter"),
    ({"proj_in.set_weight": torch.zeros(24, 16), "diffusion_model.video_patch_proj.diff": torch.zeros(24, 16)},
     "a replacement and a delta of one parameter"),
    ({"proj_in.diff": torch.zeros(24, 16), "diffusion_model.video_patch_proj.diff": torch.zeros(24, 16)},
     "two deltas of one parameter"),
    ({"blocks.0.mlp.fc1.diff": torch.zeros(64, 24)}, "on the fused projection 'blocks.0.mlp.fc1'"),
    ({"transformer_blocks.0.attn.to_out.0.diff_b": torch.zeros(24)}, "a parameter MiniMax-H3 does not have"),
    ({"proj_in.diff": torch.zeros(24, 15)}, "'proj_in.diff' is [24, 15] but the model's proj_in.weight is [24, 16]"),
    ({**block_pairs(), "transformer_blocks.0.attn.to_q.set_weight": torch.zeros(32, 24)},
     "replaces the weight that the A/B pair"),
    ({"proj_out.set_weight": torch.zeros(3 * 16, 24)}, "3 stacked heads: a ComfyUI-converted head bank"),
    ({"proj_in.diff": torch.zeros(24, 16, dtype=torch.int8)}, "not a floating-point tensor"),
    ({"proj_out.weight": torch.zeros(1025, 1, 1), "transformer_blocks.0.attn.to_q.lora_A": torch.zeros(2, 24),
      "transformer_blocks.0.attn.to_q.lora_B": torch.zeros(32, 2)}, "is not a bank of heads (1 to 1024"),
])
def test_exact_part_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], tensors: dict,
                                          fragment: str) -> None:
    path = save(tmp_path / "bad.safetensors", tensors)
    code, out, err = run_cli(capsys, "inspect", str(path), "--model", "tiny")
    assert code == 2 and out == ""
    assert fragment in assert_one_line(err, ".")


def test_a_file_of_exact_parts_only_is_an_adapter(tmp_path: Path) -> None:
    path = save(tmp_path / "deltas.safetensors", {"proj_in.diff": torch.ones(24, 16),
                                                  "diffusion_model.final_layer.norm.diff": torch.ones(24)})
    info = inspect_file(path, shapes=TINY_SHAPES)
    assert info.parts["diff"] == 2 and info.num_targets == 0
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    assert set(adapter.parts) == {"proj_in.weight", "norm_out.norm.weight"}  # native final_layer.norm mapped


def test_wan_modulation_deltas_stay_refused(tmp_path: Path) -> None:
    with pytest.raises(H3AppError, match=r"modulation delta \(\.diff_m\)"):
        inspect_file(save(tmp_path / "wan.safetensors", {"blocks.0.diff_m": torch.zeros(6, 24)}))


def test_export_refuses_what_a_peft_lora_cannot_hold(tmp_path: Path) -> None:
    from h3app.adapters.export import export_adapter

    adapter = load_adapter(save(tmp_path / "fasth3.safetensors", fasth3_tensors()), shapes=TINY_SHAPES)
    with pytest.raises(H3AppError, match="exact parts .* that a PEFT LoRA cannot hold"):
        export_adapter(adapter, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_check_note_says_which_parts_differ_and_why() -> None:
    from h3app.adapters.parts import check_note

    counts = {"lora": 10, "diff": 3, "diff_b": 2}
    note = check_note(counts, 1.0, 0.0625)
    assert "5 exact deltas" in note and "A runs them at 1 and B at 0.0625" in note and "--low-rank-only" in note
    assert "must be identical" in check_note(counts, 1.0, 0.0625, low_rank_only=True)
    assert check_note({"lora": 10, "set_weight": 4, "head_bank": 32}, 1.0, 0.0625) is None  # strength-free parts
    assert check_note(counts, 0.5, 0.5) is None


def test_the_registry_knows_fasth3_and_pdd() -> None:
    from h3app.adapters.known import FASTH3_REPO, PDD_REPO, find_known

    fast = find_known(FASTH3_REPO, "dense-datafree/fasth3.safetensors")
    assert (fast.steps, fast.shift, fast.audio_shift, fast.alpha_equals_rank) == (5, 12.0, 3.0, True)
    assert fast.sigmas == (0.999, 0.749, 0.5, 0.25, 0.0)
    ref = find_known(PDD_REPO, "MiniMax-H3-Ref2VA-Acc-8Step.safetensors")
    main = find_known(PDD_REPO, "MiniMax-H3-FL2VA-Acc-8Step.safetensors")
    assert (ref.workflow, main.workflow) == (REF2VA, None)
    assert (main.steps, main.shift, main.audio_shift, main.alpha, main.rank) == (9, 12.0, 3.0, 64.0, 64)
