"""Full-size shape model: the published config on the meta device lists every LoRA-able Linear."""


import torch
from diffusers import MiniMaxH3Transformer3DModel

from h3app.rules.h3_modules import (
    ADALN,
    ATTENTION,
    FEED_FORWARD,
    FULL_SIZE_CONFIG,
    INPUT_OUTPUT,
    REFINER,
    transformer_shapes,
)


def test_meta_device_full_size_model_matches_the_shape_table():
    """The full-size transformer on the meta device (no storage: 33B parameters in no memory) has the shape table's
    Linears; how long it takes is the machine's business (bench/, not an assert)."""
    with torch.device("meta"):
        model = MiniMaxH3Transformer3DModel()
    assert all(p.is_meta for p in model.parameters())
    linears = {n: (m.out_features, m.in_features) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    shapes = transformer_shapes(FULL_SIZE_CONFIG)
    assert len(linears) == 370 == len(shapes)
    assert linears == {name: (s.out_features, s.in_features) for name, s in shapes.linears.items()}


def test_published_shapes():
    shapes = transformer_shapes(FULL_SIZE_CONFIG)
    assert shapes["transformer_blocks.0.attn.to_q"].out_features == 56 * 128 == 7168
    assert shapes["transformer_blocks.0.attn.to_q"].in_features == 5376
    assert (shapes["transformer_blocks.49.ff.net.0.proj"].out_features,
            shapes["transformer_blocks.49.ff.net.0.proj"].in_features) == (28672, 5376)
    assert shapes["transformer_blocks.3.adaln_proj.linear"].out_features == 96768
    assert shapes["norm_out.linear"].out_features == 10752
    assert shapes["proj_in"].in_features == 96 and shapes["proj_out"].out_features == 96
    groups = {}
    for linear in shapes.linears.values():
        groups[linear.group] = groups.get(linear.group, 0) + 1
    assert groups == {ATTENTION: 200, FEED_FORWARD: 100, ADALN: 51, REFINER: 12, INPUT_OUTPUT: 7}
    # LightX2V's Turbo targets: six per block in 50 + 2 blocks = 312
    lightx2v = [n for n in shapes.linears if n.endswith(("to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2"))]
    assert len(lightx2v) == 312
