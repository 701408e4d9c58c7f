"""Every demo adapter format, loaded by the adapters package, on the tiny transformer: the equivalence pair is
bit-identical (unmerged, merged, fused), every module binds, and the output equals PEFT's with the same factors and
per-module alphas (oracle).

Binding is what this file tests. Two tests check the adapters package's demo writer and the tiny checkpoint's config
rather than binding (``test_fixture_model_is_the_tiny_checkpoint_config``, ``test_every_demo_format_is_covered``):
they belong with the adapters tests (``tests/test_adapters_demo.py``) and stay here until they move there."""

import pytest
from lora_fixtures import TINY_CONFIG, build_tiny, forward, max_rel_err, same_bits

from h3app.adapters.normalise import load_adapter
from h3app.backend.transformer_check import packed_check_input
from h3app.lora import LoRAEngine
from h3app.model.tiny import TINY_TRANSFORMER_CONFIG
from h3app.model.tiny_training.demo_adapters import tiny_shapes, write_demo_adapters
from h3app.settings import LoRASettings


@pytest.fixture(scope="module")
def demo_files(tmp_path_factory):
    return {path.parent.name if path.name == "adapter_model.safetensors" else path.stem: path
            for path in write_demo_adapters(tmp_path_factory.mktemp("demo"))}


@pytest.fixture(scope="module")
def inputs():
    return packed_check_input(build_tiny().config, seed=2)


def test_fixture_model_is_the_tiny_checkpoint_config():
    assert {k: (list(v) if isinstance(v, tuple) else v) for k, v in TINY_CONFIG.items()} == {
        k: (list(v) if isinstance(v, tuple) else v) for k, v in TINY_TRANSFORMER_CONFIG.items() if k in TINY_CONFIG}


def _load(path):
    return load_adapter(path, shapes=tiny_shapes())


def test_every_demo_format_is_covered(demo_files):
    assert len(demo_files) >= 7


@pytest.mark.parametrize("mode,fused", [("unmerged", False), ("merged", False), ("unmerged", True)])
def test_equivalence_pair_for_every_format(demo_files, inputs, mode, fused):
    for name, path in demo_files.items():
        adapter = _load(path)
        model = build_tiny(fused=fused)
        base = forward(model, inputs)
        engine = LoRAEngine(model)
        report = engine.attach(adapter, LoRASettings(source=name, alpha=8, strength=1.0, mode=mode), "a")
        assert len(report.matched) == len(adapter.modules) and not report.shape_errors, name
        out_a = forward(model, inputs)
        engine.set_lora("a", alpha=128, strength=0.0625)
        assert same_bits(forward(model, inputs), out_a), name
        assert not same_bits(out_a, base), name


def _peft_reference(adapter, inputs, strength):
    model = build_tiny()
    modules = adapter.modules
    ranks = {t: m.rank for t, m in modules.items()}
    alphas = {t: m.alpha for t, m in modules.items()}
    rslora = {m.use_rslora for m in modules.values()}
    assert len(rslora) == 1
    r, alpha = max(set(ranks.values())), max(set(alphas.values()))
    metadata = {
        "transformer.r": r,
        "transformer.lora_alpha": alpha,
        "transformer.use_rslora": rslora.pop(),
        "transformer.target_modules": sorted(modules),
        "transformer.rank_pattern": {f"^{t}$": v for t, v in ranks.items() if v != r},
        "transformer.alpha_pattern": {f"^{t}$": v for t, v in alphas.items() if v != alpha},
    }
    state = {}
    for target, m in modules.items():
        state[f"transformer.{target}.lora_A.weight"] = m.down.float().clone()
        state[f"transformer.{target}.lora_B.weight"] = m.up.float().clone()
    model.load_lora_adapter(state, prefix="transformer", adapter_name="oracle", metadata=metadata)
    model.set_adapters(["oracle"], weights=[strength])
    return forward(model, inputs)


def test_chain_alphas_match_peft_for_every_format(demo_files, inputs):
    for name, path in demo_files.items():
        adapter = _load(path)
        reference = _peft_reference(adapter, inputs, strength=0.8)
        model = build_tiny()
        LoRAEngine(model).attach(adapter, LoRASettings(source=name, strength=0.8), "a")
        assert max_rel_err(forward(model, inputs), reference) < 1e-5, name
