"""LyCORIS LoKr and LoHa load exactly: every key spelling normalises to the formula computed independently
(``lycoris_fixtures``: ``torch.kron`` and dense products in float64); the engine's outputs, unmerged and merged, equal
the same ΔW written as an exact-delta file; stacking; alpha from the file; what alpha equivalence holds; refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from adapter_fixtures import TINY_SHAPES, delta, lora_keys, relative_error, save
from lora_fixtures import assert_alpha_pair_bitwise, build_tiny, forward, max_rel_err, state_hash
from lycoris_fixtures import SPELLINGS, delta_file, kind_file, lokr_factors, stem

from h3app.adapters.inspect import inspect_file
from h3app.adapters.normalise import load_adapter
from h3app.backend.transformer_check import packed_check_input
from h3app.errors import H3AppError
from h3app.lora.engine import LoRAEngine
from h3app.settings import LoRASettings

TOLERANCE = 2e-6
KINDS = ("lokr", "loha")


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
@pytest.mark.parametrize("kind", KINDS)
def test_every_spelling_normalises_to_the_formula(kind: str, spelling: str, tmp_path: Path) -> None:
    path, expected = kind_file(tmp_path / f"{kind}.safetensors", kind, spelling, alpha=3.0)
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    assert sorted(adapter.modules) == sorted(expected) and not adapter.unmatched_keys
    for target, reference in expected.items():
        module = adapter.modules[target]
        assert module.kind == kind and module.alpha == 3.0 and module.alpha_source == "module_tensor"
        assert relative_error(delta(module), reference) < 1e-6, target
    info = inspect_file(path, shapes=TINY_SHAPES)
    assert info.suffix_style == kind and info.rank == 2 and not info.unmatched_keys


@pytest.mark.parametrize("options", [dict(rank=2, whole_w1=False), dict(rank=3, whole_w1=True), dict(rank=None)],
                         ids=["both-decomposed", "w1-whole", "both-whole"])
def test_lokr_factor_shapes_follow_the_scale_rule(options: dict, tmp_path: Path) -> None:
    """dim is W2's rank when decomposed, else W1's; both whole: scale 1 whatever the stored alpha."""
    path, expected = kind_file(tmp_path / "lokr.safetensors", "lokr", "lora_unet", alpha=6.0, **options)
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    for target, reference in expected.items():
        assert relative_error(delta(adapter.modules[target]), reference) < 1e-6, target
    whole = options["rank"] is None
    assert all(m.alpha_applies is not whole for m in adapter.modules.values())
    info = inspect_file(path, shapes=TINY_SHAPES)
    assert any("alpha does not apply" in w for w in info.warnings) is whole
    assert any("full-rank" in w and "dense ΔW" in w for w in info.warnings) is whole  # the memory it costs
    if whole:
        with pytest.raises(H3AppError, match="alpha does not apply") as refused:
            load_adapter(path, shapes=TINY_SHAPES, explicit_alpha=8.0)
        assert "\n" not in str(refused.value)


def test_no_alpha_means_scale_one_as_comfyui(tmp_path: Path) -> None:
    """No ``.alpha``: the chain's rank fallback gives alpha = dim, i.e. scale 1 (ComfyUI's rule for LoKr and LoHa)."""
    path, expected = kind_file(tmp_path / "loha.safetensors", "loha", "bare", alpha=None)
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    for target, reference in expected.items():
        assert relative_error(delta(adapter.modules[target]), reference) < 1e-6


def _outputs(path: Path, strength: float, mode: str, *, fused: bool = False,
             extra: tuple[Path, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    model = build_tiny(fused=fused)
    base = state_hash(model)
    engine = LoRAEngine(model)
    for index, source in enumerate((path, *extra)):
        engine.attach(load_adapter(source, shapes=TINY_SHAPES), LoRASettings(source=str(source), strength=strength,
                                                                              mode=mode), f"a{index}")
    result = forward(model, packed_check_input(model.config, 0))
    engine.detach()
    assert state_hash(model) == base
    return result


@pytest.mark.parametrize("mode", ["unmerged", "merged"])
@pytest.mark.parametrize("kind", KINDS)
def test_engine_equals_the_independent_delta_file(kind: str, mode: str, tmp_path: Path) -> None:
    """Fused QKV and SwiGLU in kohya names at strength 0.5, against the formula written as ``.diff`` parts."""
    path, expected = kind_file(tmp_path / f"{kind}.safetensors", kind, "lora_unet")
    reference = delta_file(tmp_path / "reference.safetensors", expected)
    got = _outputs(path, 0.5, mode)
    want = _outputs(reference, 0.5, mode)
    assert max_rel_err(got, want) < TOLERANCE
    assert max_rel_err(_outputs(path, 0.5, mode, fused=True), want) < 20 * TOLERANCE  # --fuse-qkv's to_qkv


def test_stacked_with_a_plain_lora_and_each_other(tmp_path: Path) -> None:
    lokr, lokr_delta = kind_file(tmp_path / "lokr.safetensors", "lokr", "diffusion_model", seed=1)
    loha, loha_delta = kind_file(tmp_path / "loha.safetensors", "loha", "transformer", seed=2)
    down, up = torch.randn(2, 32, generator=torch.Generator().manual_seed(5)), torch.randn(24, 2) * 0.1
    plain = save(tmp_path / "plain.safetensors", {**lora_keys("lycoris_transformer_blocks_0_attn_to_out_0", down, up, "du"),
                                                 "lycoris_transformer_blocks_0_attn_to_out_0.alpha": torch.tensor(2.0)})
    plain_delta = {"transformer_blocks.0.attn.to_out.0": up.double() @ down.double()}
    refs = [delta_file(tmp_path / f"ref{i}.safetensors", d) for i, d in enumerate((lokr_delta, loha_delta, plain_delta))]
    for mode in ("unmerged", "merged"):
        got = _outputs(lokr, 0.5, mode, extra=(loha, plain))
        assert max_rel_err(got, _outputs(refs[0], 0.5, mode, extra=tuple(refs[1:]))) < TOLERANCE


@pytest.mark.parametrize("kind,options", [("lokr", dict(rank=2, whole_w1=False)), ("lokr", dict(rank=2)),
                                          ("loha", dict(rank=2))])
def test_alpha_8_strength_1_is_alpha_128_strength_1_16th_bit_for_bit(kind: str, options: dict, tmp_path: Path) -> None:
    path, _ = kind_file(tmp_path / "k.safetensors", kind, "lora_unet", **options)
    assert_alpha_pair_bitwise(load_adapter(path, shapes=TINY_SHAPES), "k")


def test_whole_factor_lokr_refuses_an_explicit_alpha_in_the_engine(tmp_path: Path) -> None:
    path, _ = kind_file(tmp_path / "k.safetensors", "lokr", "bare", rank=None)
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    model = build_tiny()
    base = state_hash(model)
    engine = LoRAEngine(model)
    with pytest.raises(H3AppError, match="alpha does not apply"):
        engine.attach(adapter, LoRASettings(source="k", alpha=8.0), "k")
    assert state_hash(model) == base and not engine.active()
    engine.attach(adapter, LoRASettings(source="k", strength=0.5), "k")
    with pytest.raises(H3AppError, match="alpha does not apply"):
        engine.set_lora("k", alpha=128.0)
    assert engine.active()["k"].strength == 0.5
    engine.detach()
    assert state_hash(model) == base


def _bad(tmp_path: Path, name: str, tensors: dict) -> Path:
    return save(tmp_path / f"{name}.safetensors", tensors)


def test_bad_files_are_refused_in_one_line(tmp_path: Path) -> None:
    module = "blocks.0.attn.qkv_proj"
    good = lokr_factors(module, seed=0)
    cases = {
        "kron_misfit": ({**{f"{module}.{k}": v for k, v in good.items()}, f"{module}.lokr_w1": torch.randn(8, 5)},
                        r"does not fit the model"),
        "qkv_rows": ({f"{module}.lokr_w1": torch.randn(5, 4), f"{module}.lokr_w2": torch.randn(7, 6)},
                     r"not divisible by 3"),
        "half_missing": ({f"{module}.lokr_w1": torch.randn(8, 4), f"{module}.lokr_w2_a": torch.randn(12, 2)},
                         r"no lokr_w2_b"),
        "whole_and_split": ({**{f"{module}.{k}": v for k, v in good.items()}, f"{module}.lokr_w2": torch.randn(12, 6)},
                            r"both whole .* and decomposed"),
        "inner_sizes": ({f"{module}.lokr_w1": torch.randn(8, 4), f"{module}.lokr_w2_a": torch.randn(12, 2),
                         f"{module}.lokr_w2_b": torch.randn(3, 6)}, r"inner sizes differ"),
        "fp8": ({f"{module}.{k}": v.to(torch.float8_e4m3fn) for k, v in good.items()}, r"F8_E4M3.*quantised"),
        "lora_and_lokr": ({**{f"{module}.{k}": v for k, v in good.items()},
                           **lora_keys(module, torch.randn(2, 24), torch.randn(96, 2))}, r"mixes two adapters"),
        "loha_shapes": ({f"{module}.hada_w1_a": torch.randn(96, 2), f"{module}.hada_w1_b": torch.randn(2, 24),
                         f"{module}.hada_w2_a": torch.randn(48, 2), f"{module}.hada_w2_b": torch.randn(2, 24)},
                        r"do not have one shape"),
        "tucker": ({f"{module}.hada_t1": torch.randn(2, 2, 3, 3), f"{module}.hada_w1_a": torch.randn(96, 2)},
                   r"Tucker.*conv"),
    }
    for name, (tensors, expect) in cases.items():
        with pytest.raises(H3AppError, match=expect) as refused:
            load_adapter(_bad(tmp_path, name, tensors), shapes=TINY_SHAPES)
        assert "\n" not in str(refused.value), name


def test_nan_factor_is_refused_at_load(tmp_path: Path) -> None:
    path, _ = kind_file(tmp_path / "ok.safetensors", "loha", "bare")
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    key = next(k for k in tensors if k.endswith("hada_w2_a"))
    tensors[key][0, 0] = float("nan")
    inspect_file(save(tmp_path / "nan.safetensors", tensors), shapes=TINY_SHAPES)  # the header is fine
    with pytest.raises(H3AppError, match="NaN"):
        load_adapter(tmp_path / "nan.safetensors", shapes=TINY_SHAPES)


def test_simpletuner_plain_lora_under_the_lycoris_prefix(tmp_path: Path) -> None:
    down, up = torch.randn(2, 24), torch.randn(32, 2)
    key = stem("lycoris", "transformer_blocks.0.attn.to_q")
    path = save(tmp_path / "st.safetensors", {**lora_keys(key, down, up, "du"), f"{key}.alpha": torch.tensor(1.0)})
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    module = adapter.modules["transformer_blocks.0.attn.to_q"]
    assert module.kind == "lora" and torch.equal(module.up, up) and module.alpha == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_generated_frames_match_the_delta_file_in_both_modes(kind: str, backend, tmp_path: Path) -> None:
    """The whole pipeline at strength 0.5: ≥ 40 dB against the formula written as an exact-delta file (fused QKV
    and SwiGLU in kohya names), while the adapter visibly changes the frames; the base is back afterwards."""
    from h3app.backend.metrics import psnr
    from h3app.request import GenerationRequest

    path, expected = kind_file(tmp_path / f"{kind}.safetensors", kind, "lora_unet", magnitude=0.6)
    reference = delta_file(tmp_path / "reference.safetensors", expected)
    request = GenerationRequest(prompt="a paper boat", seed=3, steps=2)
    base = backend.generate(request).result.video
    for mode in ("unmerged", "merged"):
        got = backend.generate(request, [LoRASettings(source=str(path), strength=0.5, mode=mode)]).result.video
        want = backend.generate(request, [LoRASettings(source=str(reference), strength=0.5, mode=mode)]).result.video
        assert psnr(got, want) >= 40.0, mode
        assert psnr(got, base) < psnr(got, want) - 10, mode  # the adapter changed the frames


@pytest.mark.parametrize("kind,options", [("lokr", dict(rank=2, whole_w1=False)), ("loha", dict(rank=2))])
def test_the_check_says_alpha_8_and_128_are_the_same_run(kind: str, options: dict, tmp_path: Path) -> None:
    from h3app.backend.transformer_check import run_transformer_check
    from h3app.rules.check_pair import DEFAULT_A, DEFAULT_B

    path, _ = kind_file(tmp_path / "k.safetensors", kind, "lora_unet", **options)
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    model = build_tiny()
    base = state_hash(model)
    result = run_transformer_check(model, adapter, a=DEFAULT_A, b=DEFAULT_B)
    assert result["identical"] and result["control_identical"] and result["max_abs_diff"] == 0.0
    assert result["parts"][kind] == 3  # the fused QKV, the SwiGLU fc1 and out_proj: one module each
    assert "run identically in A and B" in result["parts_note"]
    assert state_hash(model) == base


def test_the_check_refuses_alpha_for_a_whole_factor_lokr(tmp_path: Path) -> None:
    from h3app.backend.transformer_check import run_transformer_check
    from h3app.rules.check_pair import DEFAULT_A, DEFAULT_B

    path, _ = kind_file(tmp_path / "k.safetensors", "lokr", "bare", rank=None)
    model = build_tiny()
    base = state_hash(model)
    with pytest.raises(H3AppError, match="alpha does not apply .* alpha × strength is not its scale"):
        run_transformer_check(model, load_adapter(path, shapes=TINY_SHAPES), a=DEFAULT_A, b=DEFAULT_B)
    assert state_hash(model) == base


def test_the_sglang_snippet_says_sglang_cannot_load_them(tmp_path: Path) -> None:
    from h3app.adapters.sglang import solve_flags

    for kind in KINDS:
        path, _ = kind_file(tmp_path / f"{kind}.safetensors", kind, "lora_unet")
        info = inspect_file(path, shapes=TINY_SHAPES)
        flags = solve_flags(info.sglang, {t: 1.0 for t in info.targets}, 1.0)
        assert flags.alpha is None and flags.scale is None and f"{kind} (5 targets)" in (flags.reason or "")


def test_every_layout_entry_is_what_the_planner_reads(tmp_path: Path) -> None:
    """Each prefix a layout lists (adapters/layouts.py) is planned as that layout, with that prefix."""
    from h3app.adapters.layouts import LAYOUTS

    names = {"native": "blocks.0.attn.out_proj", "diffusers": "transformer_blocks.0.attn.to_out.0"}
    down, up = torch.randn(2, 32), torch.randn(24, 2)
    checked = 0
    for layout in LAYOUTS:
        for prefix in layout.prefixes:
            for family in ([layout.family] if layout.family else list(names)):
                module = names[family].replace(".", "_") if layout.flattened else names[family]
                slot = "default" if layout.slot_tell else None
                path = save(tmp_path / f"{layout.name}{checked}.safetensors",
                            lora_keys(prefix + module, down, up, "ab" if slot or not layout.flattened else "du", slot))
                partition = "transformer_ref" if prefix.startswith("transformer_ref.") else "transformer"
                info = inspect_file(path, shapes=TINY_SHAPES, partition=partition)
                assert (info.format, info.prefix) == (layout.name, prefix), (layout.name, prefix, family)
                checked += 1
    assert checked >= 14
