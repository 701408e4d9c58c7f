"""Exact parts on the held transformer: outputs equal a model whose parameters were changed by hand with plain
tensors (W + strength·Δ, replacements, pairs beside deltas), in both modes; strength moves the deltas and alpha does
not; refusals are one line; and the base is bitwise back after detach, after a failure half-way and after a failed
strength change."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from adapter_fixtures import TINY_SHAPES, save
from extra_parts_fixtures import FASTH3_METADATA, apply_by_hand, block_pairs, fasth3_tensors
from lora_fixtures import build_tiny, forward, linear_shapes, make_adapter, max_rel_err, state_hash

from h3app.adapters.normalise import load_adapter
from h3app.adapters.types import ExactPart
from h3app.backend.transformer_check import packed_check_input
from h3app.errors import H3AppError
from h3app.lora.engine import LoRAEngine
from h3app.lora.layers import LoRALinear
from h3app.lora.param_patches import ParamPatches
from h3app.settings import LoRASettings

TOLERANCE = 2e-6


@pytest.fixture(scope="module")
def fasth3(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, object]:
    tensors = fasth3_tensors()
    path = save(tmp_path_factory.mktemp("fasth3") / "fasth3.safetensors", tensors, FASTH3_METADATA)
    return tensors, load_adapter(path, shapes=TINY_SHAPES)


def by_hand(tensors: dict, strength: float, lora_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs of the base model with the file's rule applied by hand."""
    reference = build_tiny()
    apply_by_hand(reference, tensors, strength, lora_scale=lora_scale)
    return forward(reference, packed_check_input(reference.config, 0))


@pytest.mark.parametrize("mode", ["unmerged", "merged"])
def test_fasth3_outputs_equal_the_rule_applied_by_hand(fasth3: tuple, mode: str) -> None:
    tensors, adapter = fasth3
    model = build_tiny()
    base = state_hash(model)
    inputs = packed_check_input(model.config, 0)
    engine = LoRAEngine(model)
    report = engine.attach(adapter, LoRASettings(source="fasth3", strength=0.5, mode=mode), "fast")
    assert len(report.exact_parameters) == len(adapter.parts)
    assert max_rel_err(forward(model, inputs), by_hand(tensors, 0.5)) < TOLERANCE
    # Alpha rescales only the pairs: alpha 8 (rank 4) doubles them and leaves the deltas at strength 0.5.
    engine.set_lora("fast", alpha=8.0)
    assert max_rel_err(forward(model, inputs), by_hand(tensors, 0.5, lora_scale=1.0)) < TOLERANCE
    engine.set_lora("fast", alpha=None, strength=1.0)  # the deltas follow the strength
    assert max_rel_err(forward(model, inputs), by_hand(tensors, 1.0)) < TOLERANCE
    engine.set_lora("fast", strength=0.25, exact_strength=1.0)  # deltas pinned at 1, pairs at 0.25
    assert max_rel_err(forward(model, inputs), by_hand(tensors, 1.0, lora_scale=0.25)) < TOLERANCE
    engine.detach()
    assert state_hash(model) == base
    assert not any(isinstance(m, LoRALinear) for m in model.modules())


def test_modes_switch_and_exact_only_layers_keep_the_plain_linear(fasth3: tuple) -> None:
    tensors, adapter = fasth3
    model = build_tiny()
    base = state_hash(model)
    inputs = packed_check_input(model.config, 0)
    engine = LoRAEngine(model)
    engine.attach(adapter, LoRASettings(source="fasth3", strength=0.7), "fast")
    assert type(model.proj_in) is torch.nn.Linear  # a delta only: written in place, no wrapper
    assert isinstance(model.transformer_blocks[0].attn.to_q, LoRALinear)
    unmerged = forward(model, inputs)
    engine.set_mode("merged")
    assert max_rel_err(forward(model, inputs), unmerged) < TOLERANCE
    engine.set_mode("unmerged")
    assert torch.equal(forward(model, inputs)[0], unmerged[0])  # rewritten from the pristine copies: same bits
    engine.detach()
    assert state_hash(model) == base


def test_a_pair_and_a_delta_on_one_weight_both_apply() -> None:
    model = build_tiny()
    shapes = linear_shapes(model)
    adapter = make_adapter(shapes, ["proj_in", "transformer_blocks.0.adaln_proj.linear"], rank=2, alpha=2.0)
    delta = torch.randn(24, 16, generator=torch.Generator().manual_seed(5)) * 0.1
    bias = torch.randn(432, generator=torch.Generator().manual_seed(6)) * 0.1
    adapter = dataclasses.replace(adapter, parts={
        "proj_in.weight": ExactPart("proj_in.weight", "diff", delta),
        "transformer_blocks.0.adaln_proj.linear.bias": ExactPart("transformer_blocks.0.adaln_proj.linear.bias",
                                                                  "diff_b", bias)})
    reference = build_tiny()
    with torch.no_grad():
        for target, module in adapter.modules.items():
            reference.get_submodule(target).weight.add_(0.5 * (module.up.double() @ module.down.double()).float())
        reference.proj_in.weight.add_(0.5 * delta)
        reference.transformer_blocks[0].adaln_proj.linear.bias.add_(0.5 * bias)
    inputs = packed_check_input(model.config, 0)
    engine = LoRAEngine(model)
    for mode in ("unmerged", "merged"):
        engine.attach(adapter, LoRASettings(source="x", strength=0.5, mode=mode), "a")
        assert max_rel_err(forward(model, inputs), forward(reference, inputs)) < TOLERANCE
        engine.detach()


def test_replacements_ignore_strength_and_come_back_off() -> None:
    model = build_tiny()
    base = state_hash(model)
    replacement = torch.randn(24, 8, generator=torch.Generator().manual_seed(7))
    norm = torch.rand(24, generator=torch.Generator().manual_seed(8)) + 0.5
    adapter = make_adapter(linear_shapes(model), ["transformer_blocks.0.attn.to_q"], rank=2, alpha=2.0)
    adapter = dataclasses.replace(adapter, parts={
        "context_embedder.weight": ExactPart("context_embedder.weight", "set_weight", replacement),
        "token_refiner.final_norm.weight": ExactPart("token_refiner.final_norm.weight", "set_weight", norm)})
    engine = LoRAEngine(model)
    engine.attach(adapter, LoRASettings(source="x", strength=0.3), "a")
    assert torch.equal(model.context_embedder.weight, replacement)
    engine.set_lora("a", strength=-2.0)
    assert torch.equal(model.context_embedder.weight, replacement)
    assert torch.equal(model.token_refiner.final_norm.weight, norm)
    engine.detach()
    assert state_hash(model) == base


def _parts(**parts: tuple[str, torch.Tensor]) -> dict[str, ExactPart]:
    return {name.replace("__", "."): ExactPart(name.replace("__", "."), kind, tensor) for name, (kind, tensor)
            in parts.items()}


def test_refusals_name_the_parameter_and_touch_nothing() -> None:
    model = build_tiny()
    base = state_hash(model)
    engine = LoRAEngine(model)
    empty = dataclasses.replace(make_adapter(linear_shapes(model), ["proj_in"], rank=2), modules={})
    first = dataclasses.replace(empty, parts=_parts(proj_in__weight=("set_weight", torch.zeros(24, 16))))
    engine.attach(first, LoRASettings(source="first"), "first")
    cases = [
        (_parts(proj_in__weight=("set_weight", torch.ones(24, 16))), "two replacements of proj_in.weight"),
        (_parts(proj_in__weight=("diff", torch.ones(24, 16))), "a replacement beside another change of proj_in.weight"),
        (_parts(proj_out__weight=("diff", torch.ones(16, 23))), r"part for proj_out.weight is \[16, 23\]"),
        (_parts(transformer_blocks__7__norm1__weight=("diff", torch.ones(24))), "which this model does not have"),
    ]
    for parts, message in cases:
        with pytest.raises(H3AppError, match=message):
            engine.attach(dataclasses.replace(empty, parts=parts), LoRASettings(source="second"), "second")
    pair = make_adapter(linear_shapes(model), ["proj_in"], rank=2)
    with pytest.raises(H3AppError, match="changes proj_in.weight, which adapter 'first' replaces"):
        engine.attach(pair, LoRASettings(source="pair"), "pair")
    assert list(engine.active()) == ["first"]
    engine.detach()
    assert state_hash(model) == base


def test_a_delta_on_a_fused_projection_is_refused() -> None:
    model = build_tiny(fused=True)
    base = state_hash(model)
    adapter = dataclasses.replace(make_adapter(linear_shapes(build_tiny()), ["proj_in"], rank=2), modules={}, parts=_parts(
        transformer_blocks__0__attn__to_q__weight=("diff", torch.ones(32, 24))))
    with pytest.raises(H3AppError, match=r"this model fuses it into transformer_blocks.0.attn.to_qkv \(--fuse-qkv\)"):
        LoRAEngine(model).attach(adapter, LoRASettings(source="x"), "a")
    assert state_hash(model) == base


@pytest.mark.parametrize("mode", ["unmerged", "merged"])
def test_a_failure_half_way_leaves_the_base_bitwise(fasth3: tuple, monkeypatch: pytest.MonkeyPatch,
                                                    mode: str) -> None:
    _, adapter = fasth3
    model = build_tiny()
    base = state_hash(model)
    engine = LoRAEngine(model)
    original = ParamPatches.write
    calls = []

    def flaky(self: ParamPatches, name: str) -> None:
        original(self, name)
        calls.append(name)
        if len(calls) == 5:  # after four parameters were written, scramble the fifth and fail
            with torch.no_grad():
                self.transformer.get_parameter(name).mul_(3.0)
            raise RuntimeError("injected")

    monkeypatch.setattr(ParamPatches, "write", flaky)
    with pytest.raises(RuntimeError, match="injected"):
        engine.attach(adapter, LoRASettings(source="fasth3", mode=mode), "fast")
    assert state_hash(model) == base and engine.active() == {}
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    monkeypatch.setattr(ParamPatches, "write", original)
    engine.attach(adapter, LoRASettings(source="fasth3", mode=mode), "fast")
    attached = state_hash(model)
    calls.clear()
    monkeypatch.setattr(ParamPatches, "write", flaky)
    with pytest.raises(RuntimeError, match="injected"):
        engine.set_lora("fast", strength=0.5)
    monkeypatch.setattr(ParamPatches, "write", original)
    assert state_hash(model) == attached and engine.active()["fast"].strength == 1.0
    engine.detach()
    assert state_hash(model) == base


def test_a_file_of_deltas_only_attaches(tmp_path: Path) -> None:
    path = save(tmp_path / "deltas.safetensors", {"proj_in.diff": torch.ones(24, 16) * 0.01,
                                                  "norm_out.norm.diff": torch.ones(24) * 0.01})
    model = build_tiny()
    base = state_hash(model)
    reference = copy.deepcopy(model)
    apply_by_hand(reference, {"proj_in.diff": torch.ones(24, 16) * 0.01, "norm_out.norm.diff": torch.ones(24) * 0.01},
                  2.0)
    engine = LoRAEngine(model)
    report = engine.attach(load_adapter(path, shapes=TINY_SHAPES), LoRASettings(source="d", strength=2.0), "d")
    assert report.matched == () and report.exact_parameters == ("norm_out.norm.weight", "proj_in.weight")
    inputs = packed_check_input(model.config, 0)
    assert max_rel_err(forward(model, inputs), forward(reference, inputs)) < TOLERANCE
    engine.detach()
    assert state_hash(model) == base


def test_the_transformer_check_tells_the_truth_about_deltas(fasth3: tuple) -> None:
    from h3app.backend.transformer_check import run_transformer_check
    from h3app.rules.check_pair import DEFAULT_A, DEFAULT_B

    _, adapter = fasth3
    model = build_tiny()
    base = state_hash(model)
    plain = run_transformer_check(model, adapter, a=DEFAULT_A, b=DEFAULT_B)
    assert not plain["identical"] and plain["control_identical"]
    assert "alpha does not apply to them" in plain["parts_note"] and "--low-rank-only" in plain["parts_note"]
    equivalent = run_transformer_check(model, adapter, a=DEFAULT_A, b=DEFAULT_B, low_rank_only=True)
    assert equivalent["identical"] and equivalent["low_rank_only"]
    pairs_only = dataclasses.replace(adapter, parts={})
    assert run_transformer_check(model, pairs_only, a=DEFAULT_A, b=DEFAULT_B)["parts_note"] is not None  # info kept
    assert run_transformer_check(model, pairs_only, a=DEFAULT_A, b=DEFAULT_B)["identical"]
    assert state_hash(model) == base
    assert block_pairs()  # the fixture's pairs exist (the check above compared something)


def test_the_cache_counts_exact_parts(fasth3: tuple) -> None:
    from h3app.lora.cache import adapter_nbytes

    _, adapter = fasth3
    parts = sum(part.tensor.nbytes for part in adapter.parts.values())
    assert adapter_nbytes(adapter) == adapter_nbytes(dataclasses.replace(adapter, parts={})) + parts


def test_check_cli_offers_the_equivalent_comparison(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from cli_runner import run_cli

    path = save(tmp_path / "fasth3.safetensors", fasth3_tensors(), FASTH3_METADATA)
    code, out, _ = run_cli(capsys, "check", "--adapter", str(path))
    assert code == 0 and "DIFFERENT" in out and "--low-rank-only" in out
    code, out, _ = run_cli(capsys, "check", "--adapter", str(path), "--low-rank-only", "--json")
    result = json.loads(out)
    assert code == 0 and result["identical"] and result["low_rank_only"] and result["parts"]["diff"] > 0


@pytest.mark.slow
def test_full_check_offers_the_equivalent_run(backend, tmp_path: Path) -> None:
    """The whole pipeline with B rescaling only the low-rank parts is bit-identical (the plain pair differs, and
    says why: transformer mode above and ``check_note``)."""
    from h3app.backend.equivalence import run_equivalence
    from h3app.request import GenerationRequest

    path = save(tmp_path / "fasth3.safetensors", fasth3_tensors(), FASTH3_METADATA)
    request = GenerationRequest(prompt="a paper boat", seed=2, steps=2)
    result = run_equivalence(backend.binder, request, LoRASettings(source=str(path)), outputs=backend.outputs,
                             low_rank_only=True)
    payload = result.to_json()
    assert result.identical and result.control_identical and payload["low_rank_only"]
    assert "must be identical" in payload["parts_note"] and payload["parts"]["diff"] > 0
    assert payload["max_abs_diff"] == 0.0 and payload["fallback_max_abs_diff"] > 0
