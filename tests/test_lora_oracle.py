"""Oracle: the transformer output with h3app's engine equals diffusers ``load_lora_adapter`` + PEFT (unfused tiny
transformer, fp32) for the same PEFT-format adapter and alpha; fused h3app agrees too."""

import pytest
from lora_fixtures import build_tiny, forward, linear_shapes, make_adapter, max_rel_err

from h3app.backend.transformer_check import packed_check_input
from h3app.lora import LoRAEngine
from h3app.settings import LoRASettings

ORACLE_TARGETS_SUFFIXES = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2",
                           "adaln_proj.linear")


def _peft_state_dict(adapter):
    state = {}
    for target, module in adapter.modules.items():
        state[f"transformer.{target}.lora_A.weight"] = module.down.clone()
        state[f"transformer.{target}.lora_B.weight"] = module.up.clone()
    return state


def _peft_output(adapter, inputs, *, r, lora_alpha, strength, rank_pattern=None, alpha_pattern=None):
    model = build_tiny()
    metadata = {
        "transformer.r": r,
        "transformer.lora_alpha": lora_alpha,
        "transformer.target_modules": sorted(adapter.modules),
        "transformer.rank_pattern": rank_pattern or {},
        "transformer.alpha_pattern": alpha_pattern or {},
    }
    model.load_lora_adapter(_peft_state_dict(adapter), prefix="transformer", adapter_name="oracle", metadata=metadata)
    model.set_adapters(["oracle"], weights=[strength])
    return forward(model, inputs)


def _h3app_output(adapter, inputs, *, alpha, strength, fused=False, mode="unmerged"):
    model = build_tiny(fused=fused)
    LoRAEngine(model).attach(adapter, LoRASettings(source="s", alpha=alpha, strength=strength, mode=mode), "a")
    return forward(model, inputs)


@pytest.fixture(scope="module")
def setup():
    model = build_tiny()
    shapes = linear_shapes(model)
    targets = [t for t in shapes if any(t.endswith("." + s) for s in ORACLE_TARGETS_SUFFIXES)] + ["proj_out", "proj_in"]
    return shapes, targets, packed_check_input(model.config, seed=11)


@pytest.mark.parametrize("mode,fused", [("unmerged", False), ("merged", False), ("unmerged", True)])
def test_uniform_rank_matches_diffusers_peft(setup, mode, fused):
    shapes, targets, inputs = setup
    adapter = make_adapter(shapes, targets, rank=8, alpha=None, magnitude=0.2)
    reference = _peft_output(adapter, inputs, r=8, lora_alpha=4, strength=0.7)
    base = forward(build_tiny(), inputs)
    assert max_rel_err(reference, base) > 1e-2  # the adapter matters, so agreement means something
    ours = _h3app_output(adapter, inputs, alpha=4.0, strength=0.7, fused=fused, mode=mode)
    assert max_rel_err(ours, reference) < 1e-5


def test_mixed_ranks_and_alpha_pattern_match_diffusers_peft(setup):
    shapes, targets, inputs = setup
    ranks = {t: (4 if "adaln" in t else 8) for t in targets}
    alphas = {t: (2.0 if ".ff." in t else 16.0) for t in targets}
    adapter = make_adapter(shapes, targets, rank=ranks, alpha=alphas, alpha_source="adapter_config", magnitude=0.2)
    rank_pattern = {f"^{t}$": r for t, r in ranks.items() if r != 8}
    alpha_pattern = {f"^{t}$": a for t, a in alphas.items() if a != 16.0}
    reference = _peft_output(adapter, inputs, r=8, lora_alpha=16, strength=1.3, rank_pattern=rank_pattern,
                             alpha_pattern=alpha_pattern)
    ours = _h3app_output(adapter, inputs, alpha=None, strength=1.3)  # per-module chain alphas
    assert max_rel_err(ours, reference) < 1e-5
    wrong = _h3app_output(adapter, inputs, alpha=16.0, strength=1.3)  # one alpha for all: must not match
    assert max_rel_err(wrong, reference) > 1e-3
