"""DoRA, PEFT's rule, in both spellings: the engine's outputs (unmerged and merged) equal the rule computed by hand
and written as an exact-delta file, and PEFT itself; the magnitude applies at strength 0 while detaching is the base
bit for bit; alpha 8 / 1.0 ≡ alpha 128 / 0.0625; bad files and settings are refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from adapter_fixtures import TINY_SHAPES, save
from dora_fixtures import PEFT_TARGETS, base_weights, dora_delta_file, kohya_dora_file, peft_dora_file
from lora_fixtures import assert_alpha_pair_bitwise, build_tiny, forward, max_rel_err, state_hash

from h3app.adapters.inspect import inspect_file
from h3app.adapters.normalise import load_adapter
from h3app.backend.transformer_check import packed_check_input
from h3app.errors import H3AppError
from h3app.lora.engine import LoRAEngine
from h3app.settings import LoRASettings

TOLERANCE = 5e-6
KOHYA_TARGETS = ("transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k", "transformer_blocks.0.attn.to_v",
                 "transformer_blocks.1.ff.net.0.proj")
WRITERS = {"peft": (peft_dora_file, PEFT_TARGETS), "kohya": (kohya_dora_file, KOHYA_TARGETS)}


def _run(paths: tuple[Path, ...], strength: float, mode: str, **settings) -> tuple[torch.Tensor, torch.Tensor]:
    model = build_tiny()
    base = state_hash(model)
    engine = LoRAEngine(model)
    for index, path in enumerate(paths):
        engine.attach(load_adapter(path, shapes=TINY_SHAPES),
                      LoRASettings(source=str(path), strength=strength, mode=mode, **settings), f"a{index}")
    result = forward(model, packed_check_input(model.config, 0))
    engine.detach()
    assert state_hash(model) == base
    return result


@pytest.mark.parametrize("mode", ["unmerged", "merged"])
@pytest.mark.parametrize("spelling", sorted(WRITERS))
def test_engine_equals_the_rule_written_as_a_delta_file(spelling: str, mode: str, tmp_path: Path) -> None:
    write, targets = WRITERS[spelling]
    weights = base_weights(build_tiny(), targets)
    path, factors = write(tmp_path / "dora.safetensors", weights, rank=2, alpha=4.0)
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    assert adapter.has_magnitudes and sorted(adapter.modules) == sorted(targets)
    for strength in (0.5, 0.0):  # s = alpha / rank × strength; at 0 the magnitude still applies
        reference = dora_delta_file(tmp_path / f"ref{strength}.safetensors", weights, factors, 4.0 / 2 * strength)
        assert max_rel_err(_run((path,), strength, mode), _run((reference,), 1.0, mode)) < TOLERANCE
    assert max_rel_err(_run((path,), 0.0, mode), _run((), 1.0, mode)) > 1e-3  # strength 0 is not the base


def test_engine_equals_peft_itself(tmp_path: Path) -> None:
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict

    weights = base_weights(build_tiny(), PEFT_TARGETS)
    path, factors = peft_dora_file(tmp_path / "dora.safetensors", weights, rank=2, alpha=4.0)
    oracle = build_tiny()
    inject_adapter_in_model(LoraConfig(r=2, lora_alpha=4.0, target_modules=list(PEFT_TARGETS), use_dora=True), oracle)
    state = {}
    for target, (down, up, magnitude) in factors.items():
        state.update({f"{target}.lora_A.weight": down, f"{target}.lora_B.weight": up,
                      f"{target}.lora_magnitude_vector": magnitude})
    result = set_peft_model_state_dict(oracle, state)
    assert not [k for k in result.unexpected_keys if "lora" in k]
    expected = forward(oracle.eval(), packed_check_input(oracle.config, 0))
    for mode in ("unmerged", "merged"):
        assert max_rel_err(_run((path,), 1.0, mode), expected) < TOLERANCE


def test_stacked_with_a_plain_lora(tmp_path: Path) -> None:
    weights = base_weights(build_tiny(), PEFT_TARGETS)
    path, factors = peft_dora_file(tmp_path / "dora.safetensors", weights)
    down, up = torch.randn(2, 32, generator=torch.Generator().manual_seed(9)), torch.randn(24, 2) * 0.2
    plain = save(tmp_path / "plain.safetensors", {"transformer_blocks.0.attn.to_out.0.lora_A.weight": down,
                                                   "transformer_blocks.0.attn.to_out.0.lora_B.weight": up})
    reference = dora_delta_file(tmp_path / "ref.safetensors", weights, factors, 2.0 * 0.5)
    plain_ref = save(tmp_path / "plain_ref.safetensors",
                     {"transformer_blocks.0.attn.to_out.0.diff": (up.double() @ down.double()).float()})
    for mode in ("unmerged", "merged"):
        # PEFT's rule normalises the base weight (not the other adapter's): the two deltas add.
        got = _run((plain, path), 0.5, mode)
        model = build_tiny()
        engine = LoRAEngine(model)
        engine.attach(load_adapter(reference, shapes=TINY_SHAPES), LoRASettings(source="r", strength=1.0, mode=mode), "r")
        engine.attach(load_adapter(plain_ref, shapes=TINY_SHAPES), LoRASettings(source="p", strength=0.5, mode=mode), "p")
        want = forward(model, packed_check_input(model.config, 0))
        engine.detach()
        assert max_rel_err(got, want) < TOLERANCE, mode


@pytest.mark.parametrize("spelling", sorted(WRITERS))
def test_alpha_8_strength_1_is_alpha_128_strength_1_16th_bit_for_bit(spelling: str, tmp_path: Path) -> None:
    write, targets = WRITERS[spelling]
    path, _ = write(tmp_path / "dora.safetensors", base_weights(build_tiny(), targets))
    assert_alpha_pair_bitwise(load_adapter(path, shapes=TINY_SHAPES), "d")


def _bad_file(tmp_path: Path, name: str, changes: dict, drop: tuple[str, ...] = ()) -> Path:
    weights = base_weights(build_tiny(), PEFT_TARGETS)
    path, _ = peft_dora_file(tmp_path / f"{name}_ok.safetensors", weights)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys() if k not in drop}
        metadata = handle.metadata()
    tensors.update(changes)
    return save(tmp_path / f"{name}.safetensors", tensors, metadata)


MAGNITUDE = "transformer.transformer_blocks.0.attn.to_q.lora_magnitude_vector"


@pytest.mark.parametrize("name,changes,expect", [
    ("wrong_length", {MAGNITUDE: torch.ones(31)}, r"is \[31\] but module .* has 32 output rows"),
    ("input_axis", {MAGNITUDE: torch.ones(1, 24)}, r"input axis"),
    ("fp8", {MAGNITUDE: torch.ones(32).to(torch.float8_e4m3fn)}, r"F8_E4M3.*quantised"),
    ("on_lokr", {"transformer.transformer_blocks.0.attn.to_out.0.lokr_w1": torch.ones(4, 4),
                 "transformer.transformer_blocks.0.attn.to_out.0.lokr_w2": torch.ones(6, 8),
                 "transformer.transformer_blocks.0.attn.to_out.0.dora_scale": torch.ones(24, 1)}, r"DoRA on A/B pairs only"),
])
def test_bad_magnitudes_are_refused_in_one_line(name: str, changes: dict, expect: str, tmp_path: Path) -> None:
    drop = ("transformer.transformer_blocks.0.attn.to_out.0.lora_A.weight",
            "transformer.transformer_blocks.0.attn.to_out.0.lora_B.weight",
            "transformer.transformer_blocks.0.attn.to_out.0.lora_magnitude_vector") if name == "on_lokr" else ()
    path = _bad_file(tmp_path, name, changes, drop)
    with pytest.raises(H3AppError, match=expect) as refused:
        inspect_file(path, shapes=TINY_SHAPES)
    assert "\n" not in str(refused.value)


def test_nan_magnitude_is_refused_at_load(tmp_path: Path) -> None:
    bad = torch.ones(32)
    bad[3] = float("nan")
    path = _bad_file(tmp_path, "nan", {MAGNITUDE: bad})
    inspect_file(path, shapes=TINY_SHAPES)
    with pytest.raises(H3AppError, match="NaN"):
        load_adapter(path, shapes=TINY_SHAPES)


def test_fused_qkv_and_per_modality_strength_are_refused_and_touch_nothing(tmp_path: Path) -> None:
    path, _ = peft_dora_file(tmp_path / "dora.safetensors", base_weights(build_tiny(), PEFT_TARGETS))
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    fused = build_tiny(fused=True)
    base = state_hash(fused)
    with pytest.raises(H3AppError, match="fuse-qkv"):
        LoRAEngine(fused).attach(adapter, LoRASettings(source="d"), "d")
    assert state_hash(fused) == base
    model = build_tiny()
    base = state_hash(model)
    engine = LoRAEngine(model)
    with pytest.raises(H3AppError, match="per-modality"):
        engine.attach(adapter, LoRASettings(source="d", audio_strength=0.0), "d")
    assert state_hash(model) == base and not engine.active()


@pytest.mark.slow
def test_generated_frames_match_the_rule_and_off_is_the_base(backend, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole pipeline at strength 0.5, both modes, both spellings: ≥ 40 dB against the rule written as an
    exact-delta file for the session model's own weights; a no-LoRA run (the check's baseline, and the compile
    path's "strength 0 in place") detaches the DoRA, so it stays bitwise the base."""
    import dataclasses

    from h3app.backend.metrics import psnr
    from h3app.request import GenerationRequest
    from h3app.rules.choices import T2VA

    transformer = backend.model.transformer(T2VA)
    request = GenerationRequest(prompt="a paper boat", seed=3, steps=2)
    base = backend.generate(request).result
    every = base_weights(transformer, set(PEFT_TARGETS) | set(KOHYA_TARGETS))  # before any adapter is merged
    for spelling, (write, targets) in sorted(WRITERS.items()):
        weights = {t: every[t] for t in targets}
        path, factors = write(tmp_path / f"{spelling}.safetensors", weights, rank=2, alpha=4.0)
        reference = dora_delta_file(tmp_path / f"{spelling}_ref.safetensors", weights, factors, 4.0 / 2 * 0.5)
        for mode in ("unmerged", "merged"):
            got = backend.generate(request, [LoRASettings(source=str(path), strength=0.5, mode=mode)]).result.video
            want = backend.generate(request, [LoRASettings(source=str(reference), mode=mode)]).result.video
            assert psnr(got, want) >= 40.0 and psnr(got, base.video) < psnr(got, want) - 10, (spelling, mode)
    # The compile path keeps low-rank-only adapters attached at strength 0 for a no-LoRA run; a DoRA is detached.
    monkeypatch.setattr(backend.model, "options", dataclasses.replace(backend.model.options, compile=True))
    path = tmp_path / "peft.safetensors"
    backend.binder.baseline(T2VA, [LoRASettings(source=str(path))])
    assert not backend.binder.engine(T2VA).active()
    assert backend.generate(request).result.hash == base.hash


def test_the_check_says_alpha_8_and_128_are_the_same_run_and_warns_about_strength_0(tmp_path: Path) -> None:
    from h3app.backend.transformer_check import run_transformer_check
    from h3app.rules.check_pair import DEFAULT_A, DEFAULT_B

    path, _ = kohya_dora_file(tmp_path / "dora.safetensors", base_weights(build_tiny(), KOHYA_TARGETS))
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    assert adapter.info.parts["dora"] == 2
    model = build_tiny()
    base = state_hash(model)
    result = run_transformer_check(model, adapter, a=DEFAULT_A, b=DEFAULT_B)
    assert result["identical"] and "DoRA (2 modules)" in result["parts_note"]
    assert any("strength 0 is the magnitude alone" in w for w in result["warnings"])
    assert state_hash(model) == base


def test_a_dora_beside_an_exact_part_on_its_weight_is_refused_either_way(tmp_path: Path) -> None:
    weights = base_weights(build_tiny(), PEFT_TARGETS)
    path, _ = peft_dora_file(tmp_path / "dora.safetensors", weights)
    part = save(tmp_path / "part.safetensors", {"transformer_blocks.0.attn.to_q.diff": torch.ones(32, 24) * 0.01})
    for first, second in ((path, part), (part, path)):
        model = build_tiny()
        base = state_hash(model)
        engine = LoRAEngine(model)
        engine.attach(load_adapter(first, shapes=TINY_SHAPES), LoRASettings(source="1"), "first")
        with pytest.raises(H3AppError, match="a DoRA and an exact part"):
            engine.attach(load_adapter(second, shapes=TINY_SHAPES), LoRASettings(source="2"), "second")
        assert list(engine.active()) == ["first"]
        engine.detach()
        assert state_hash(model) == base


def test_the_cache_counts_the_magnitudes(tmp_path: Path) -> None:
    import dataclasses

    from h3app.lora.cache import adapter_nbytes

    path, _ = peft_dora_file(tmp_path / "dora.safetensors", base_weights(build_tiny(), PEFT_TARGETS))
    adapter = load_adapter(path, shapes=TINY_SHAPES)
    plain = dataclasses.replace(adapter, modules={t: dataclasses.replace(m, magnitude=None)
                                                  for t, m in adapter.modules.items()})
    magnitudes = sum(m.magnitude.nbytes for m in adapter.modules.values() if m.magnitude is not None)
    assert magnitudes > 0 and adapter_nbytes(adapter) == adapter_nbytes(plain) + magnitudes


@pytest.mark.parametrize("spelling", sorted(WRITERS))
def test_the_strength_rule_is_said_where_the_strength_is_set(spelling: str, tmp_path: Path) -> None:
    """inspect's resolution (what the alpha card and every job show beside the strength) carries DoRA's rule; the
    same file without its magnitudes (a plain LoRA) does not."""
    from safetensors.torch import load_file

    from h3app.adapters.resolved import resolve_adapter
    from h3app.rules.scale import DORA_STRENGTH_RULE

    write, targets = WRITERS[spelling]
    path, _ = write(tmp_path / "dora.safetensors", base_weights(build_tiny(), targets))
    assert DORA_STRENGTH_RULE in resolve_adapter(inspect_file(path, shapes=TINY_SHAPES), strength=0.5).warnings
    plain = {k: v for k, v in load_file(str(path)).items() if "magnitude" not in k and "dora_scale" not in k}
    plain_path = save(tmp_path / "plain.safetensors", plain)
    assert DORA_STRENGTH_RULE not in resolve_adapter(inspect_file(plain_path, shapes=TINY_SHAPES)).warnings
