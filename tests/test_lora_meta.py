"""The full-size transformer on the meta device accepts full-size LightX2V- and Larry-shaped adapters (meta tensors:
no data), unfused and fused, with every target matched at the right shape; a wrong-size adapter is refused."""

import pytest
import torch
from lora_fixtures import LIGHTX2V_SUFFIXES, block_targets, fuse, make_adapter

from h3app.lora import LoRAEngine, MatchError
from h3app.rules.h3_modules import FULL_SIZE_CONFIG, transformer_shapes
from h3app.settings import LoRASettings

FULL_SHAPES = {name: (s.out_features, s.in_features) for name, s in transformer_shapes(FULL_SIZE_CONFIG).linears.items()}


def _full_size(fused: bool = False) -> torch.nn.Module:
    from diffusers import MiniMaxH3Transformer3DModel

    with torch.device("meta"):
        model = MiniMaxH3Transformer3DModel()
    if fused:
        fuse(model)
    return model


def _lightx2v():
    targets = block_targets(FULL_SHAPES, LIGHTX2V_SUFFIXES)
    return make_adapter(FULL_SHAPES, targets, rank=128, alpha=None, device="meta", dtype=torch.bfloat16)


def _larry():
    targets = block_targets(FULL_SHAPES, LIGHTX2V_SUFFIXES + ("adaln_proj.linear",)) + ["norm_out.linear"]
    ranks = {t: (16 if "adaln" in t or t == "norm_out.linear" else 64) for t in targets}
    return make_adapter(FULL_SHAPES, targets, rank=ranks, alpha=None, device="meta", dtype=torch.bfloat16,
                        shared_qkv_down=True)


def test_discovered_targets_equal_the_config_shapes():
    engine = LoRAEngine(_full_size())
    assert {t: (s.out_features, s.in_features) for t, s in engine.targets.items()} == FULL_SHAPES
    assert len(FULL_SHAPES) == 370


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
@pytest.mark.parametrize("kind,count", [("lightx2v", 312), ("larry", 363)])
def test_full_size_adapters_match_every_target(fused, kind, count):
    adapter = _lightx2v() if kind == "lightx2v" else _larry()
    assert len(adapter.modules) == count
    model = _full_size(fused)
    engine = LoRAEngine(model)
    report = engine.attach(adapter, LoRASettings(source=kind), kind)
    assert len(report.matched) == count and not report.shape_errors and not report.unmatched_keys
    assert len(report.uncovered_targets) == 370 - count
    assert report.profile is None  # no data on meta
    for match in report.matched:
        out_features, in_features = FULL_SHAPES[match.target]
        module = adapter.modules[match.target]
        assert tuple(module.down.shape) == (match.rank, in_features) and tuple(module.up.shape) == (out_features, match.rank)
        assert match.effective_scale == 1.0  # alpha = rank fallback, strength 1
    qkv = engine._adapters[kind].entries
    if fused:
        entry = qkv["transformer_blocks.49.attn.to_qkv"]
        # Larry's shared A gives one 2D delta over the blocked [q; k; v] rows; LightX2V's split A a 3D stack.
        expected = (128, 5376) if kind == "lightx2v" else (64, 5376)
        assert entry.stacked == (kind == "lightx2v")
        assert tuple(entry.down.shape[-2:]) == expected
        assert entry.up.shape[-2] == (7168 if kind == "lightx2v" else 3 * 7168)
    if kind == "larry":
        assert [m.rank for m in report.matched if m.target == "transformer_blocks.0.adaln_proj.linear"] == [16]
    engine.detach()
    assert not any(type(m).__name__ == "LoRALinear" for m in model.modules())


def test_pruned_adaln_adapter_is_refused_with_its_shapes():
    pruned = dict(FULL_SHAPES, **{"transformer_blocks.0.adaln_proj.linear": (96768, 512)})
    adapter = make_adapter(pruned, ["transformer_blocks.0.adaln_proj.linear", "transformer_blocks.0.attn.to_q"],
                           rank=16, alpha=16.0, device="meta")
    engine = LoRAEngine(_full_size())
    with pytest.raises(MatchError, match="A has in_features 512, the model's layer has 2688"):
        engine.attach(adapter, LoRASettings(source="pruned"), "pruned")
    assert engine.active() == {}


def test_merged_mode_is_refused_on_meta():
    from h3app.errors import H3AppError

    engine = LoRAEngine(_full_size())
    with pytest.raises(H3AppError, match="merged mode is not available: .*meta device"):
        engine.attach(_lightx2v(), LoRASettings(source="x", mode="merged"), "x")
    assert engine.active() == {}
