"""``--compile`` with advanced strength (aot_eager on the CPU, as tests/test_compile.py): a scheduled run refills the
scale tensors between evaluations and recompiles nothing; per-modality sliders move without a recompile once the
graph with factors exists; compiled and eager agree."""

from __future__ import annotations

import pytest
import torch
from lora_fixtures import build_tiny, forward, linear_shapes, make_adapter

from h3app.backend.transformer_check import packed_check_input
from h3app.lora import LoRAEngine
from h3app.lora.evaluations import RunSchedule, evaluation_events
from h3app.model.compiled import compile_blocks, compile_report
from h3app.settings import LoRASettings


@pytest.mark.slow  # torch.compile's first graphs: seconds
def test_a_scheduled_run_with_modality_factors_never_recompiles():
    torch._dynamo.reset()
    model = build_tiny()
    shapes = linear_shapes(model)
    adapter = make_adapter(shapes, [t for t in shapes if t.startswith("transformer_blocks.")], rank=4, alpha=8)
    inputs = packed_check_input(model.config, seed=0)
    eager_model = build_tiny()
    compile_blocks(model, "cpu")
    settings = LoRASettings(source="s", audio_strength=0.0, video_strength=0.8, block_strength="1:1.5",
                            strength_schedule="cosine:1:0.25")
    engine, eager = LoRAEngine(model), LoRAEngine(eager_model)
    engine.attach(adapter, settings, "a")
    eager.attach(adapter, settings, "a")
    schedule = RunSchedule.of(6, 12.0, 3.0)

    def run(target: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        with evaluation_events(target, schedule):
            return [forward(target, inputs) for _ in range(schedule.count)]

    run(model)  # builds the graphs of this adapter with its factors
    warm = compile_report()
    assert warm["graphs"] > 0 and warm["recompiles"] == 0  # the first scheduled run: five evaluations, one graph set
    outputs = run(model)
    engine.set_lora("a", strength=0.5, advanced=LoRASettings(source="s", audio_strength=0.5, video_strength=1.0,
                                                             text_strength=0.0, block_strength="0:2",
                                                             strength_schedule="1,0,0.5,1,0.25"))
    moved = run(model)
    assert compile_report() == warm  # five evaluations each, new factors and a new schedule: no new graph
    assert len({float(video.sum()) for video, _ in outputs}) == schedule.count  # every evaluation differs
    assert not torch.equal(moved[0][0], outputs[0][0])
    for got, want in zip(outputs, run(eager_model)):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    engine.detach()
    eager.detach()
