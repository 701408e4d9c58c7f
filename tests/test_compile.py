"""``--compile`` on the tiny transformer (aot_eager on the CPU): LoRA settings live in tensors, so an alpha × strength
grid, group strengths and swapping adapters of the same ranks never recompile; A and B stay bit-identical."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lora_fixtures import build_tiny, forward, linear_shapes, make_adapter, same_bits

from h3app.backend.transformer_check import packed_check_input
from h3app.lora import LoRAEngine
from h3app.model import compiled as compiled_module
from h3app.model.compiled import blocks_of, compile_backend, compile_blocks, compile_report
from h3app.settings import LoRASettings

ROOT = Path(__file__).resolve().parents[1]
TURBO = str(ROOT / "assets" / "adapters" / "lightx2v_turbo_no_alpha.safetensors")


def is_compiled(block: torch.nn.Module) -> bool:
    """Whether ``block`` runs through ``torch.compile`` (its ``forward`` is the compiled one)."""
    return compiled_module.is_compiled(block) and "forward" in vars(block) and block.forward is not type(block).forward


def test_backend_is_inductor_on_cuda_and_aot_eager_elsewhere():
    assert compile_backend("cuda") == "inductor" and compile_backend("cuda:1") == "inductor"
    assert compile_backend("cpu") == "aot_eager"


@pytest.fixture(scope="module")
def compiled():
    torch._dynamo.reset()
    model = build_tiny()
    shapes = linear_shapes(model)
    inputs = packed_check_input(model.config, seed=0)
    eager = forward(model, inputs)
    assert compile_blocks(model, "cpu") == len(blocks_of(model)) > 0
    assert all(is_compiled(block) for block in blocks_of(model))
    targets = [t for t in shapes if t != "time_embedder.linear_1"]
    return model, shapes, targets, inputs, eager


@pytest.mark.slow
def test_compiled_base_matches_eager(compiled):
    model, _, _, inputs, eager = compiled
    before = compile_report()
    assert same_bits(forward(model, inputs), eager)
    assert compile_report()["graphs"] >= before["graphs"]


@pytest.mark.slow
def test_alpha_strength_grid_group_strengths_and_adapter_swaps_never_recompile(compiled):
    model, shapes, targets, inputs, _ = compiled
    engine = LoRAEngine(model)
    engine.attach(make_adapter(shapes, targets, rank=4), LoRASettings(source="s", alpha=8, strength=1.0), "a")
    out_a = forward(model, inputs)  # the first LoRA forward builds the LoRA graphs
    engine.detach("a")
    forward(model, inputs)  # and back to the base graphs (built before)
    engine.attach(make_adapter(shapes, targets, rank=4), LoRASettings(source="s", alpha=8, strength=1.0), "a")
    warm = compile_report()

    engine.set_lora("a", alpha=128, strength=0.0625)
    assert same_bits(forward(model, inputs), out_a)  # A and B bit-identical, compiled
    outputs = set()
    for alpha in (1.0, 16.0, None):
        for strength in (-1.0, 0.5, 2.0):
            engine.set_lora("a", alpha=alpha, strength=strength)
            outputs.add(forward(model, inputs)[0].sum().item())
    engine.set_lora("a", group_strengths={"attention": 0.25, "feed_forward": 2.0})
    forward(model, inputs)
    engine.detach("a")
    forward(model, inputs)
    engine.attach(make_adapter(shapes, targets, rank=4, seed=7), LoRASettings(source="t", alpha=2, strength=1.0), "b")
    forward(model, inputs)
    engine.detach("b")
    assert len(outputs) > 4  # the settings did change the output
    assert compile_report() == warm  # zero new graphs, zero recompiles


def test_compiled_lora_matches_eager_lora(compiled):
    model, shapes, targets, inputs, _ = compiled
    adapter = make_adapter(shapes, targets, rank=4, seed=3)
    engine = LoRAEngine(model)
    engine.attach(adapter, LoRASettings(source="s", alpha=8, strength=0.7), "a")
    got = forward(model, inputs)
    engine.detach("a")
    eager_model = build_tiny()
    LoRAEngine(eager_model).attach(adapter, LoRASettings(source="s", alpha=8, strength=0.7), "a")
    want = forward(eager_model, inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_check_command_reports_dynamo_counts_in_json():
    result = subprocess.run([sys.executable, "-m", "h3app", "check", "--model", "tiny", "--adapter", TURBO,
                             "--compile", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=600,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(result.stdout)
    assert data["identical"] is True
    assert set(data["compile"]) == {"graphs", "recompiles"} and data["compile"]["graphs"] > 0
