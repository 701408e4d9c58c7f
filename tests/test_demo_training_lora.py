"""The demo LoRAs train through the app's own LoRA layer: what the trainer's transformer computes with an adapter
bound is, bit for bit, what the app computes after loading the file the trainer writes (one LoRA, one scale
formula), and binding leaves the transformer as it was."""

import copy

import pytest
import torch

from h3app.adapters.normalise import load_adapter
from h3app.lora import LoRAEngine, LoRALinear
from h3app.model.tiny_training import flow, recipe
from h3app.model.tiny_training.demo_adapters import tiny_shapes
from h3app.model.tiny_training.lora import TrainingLora, write_turbo, write_with_alpha
from h3app.rules.frames import RELEASED
from h3app.settings import LoRASettings

PROMPT = "a green ball moving up over a sand floor, high loud hum"
FRAMES = RELEASED.frames_per_chunk + RELEASED.latents_per_chunk  # the shortest clip the layout builds


@pytest.fixture(scope="module")
def setting(tiny_model):
    """A private copy of the tiny transformer (binding swaps its modules) and a flow context on the tiny pipeline."""
    transformer = copy.deepcopy(tiny_model.transformer()).requires_grad_(False)
    ctx = flow.FlowContext(tiny_model.pipeline(), FRAMES)
    noise_v, noise_a = recipe.pipeline_noise(ctx, seed=3)
    return transformer, ctx, ctx.layout(PROMPT), noise_v, noise_a


def trained_lora(transformer, rank: int, alpha: float) -> TrainingLora:
    """A training LoRA as after some steps: ``B`` no longer zero."""
    adapter = TrainingLora.start(transformer, rank, alpha, seed=1)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for _, up in adapter.factors.values():
            up.copy_(torch.randn(up.shape, generator=generator) * 0.3)
    return adapter


def velocity(setting):
    transformer, ctx, layout, noise_v, noise_a = setting
    return ctx.velocity(transformer, layout, noise_v, noise_a, 0.4, 0.6)


@pytest.mark.parametrize("write, alpha", [(write_turbo, recipe.TURBO_ALPHA), (write_with_alpha, None)],
                         ids=["turbo layout, alpha given", "style layout, alpha stored"])
def test_the_written_file_applies_exactly_as_it_trained(setting, tmp_path, write, alpha):
    transformer = setting[0]
    base = velocity(setting)
    adapter = trained_lora(transformer, recipe.TURBO_RANK, recipe.TURBO_ALPHA)
    with adapter.bound(transformer):
        trained = velocity(setting)  # with grad, as in training
        sum(t.square().mean() for t in trained).backward()
    assert all(up.grad is not None and up.grad.abs().sum() > 0 for _, up in adapter.factors.values())
    assert not any(isinstance(module, LoRALinear) for module in transformer.modules()), "bound() left wrappers"
    assert all(torch.equal(a, b) for a, b in zip(velocity(setting), base)), "the base changed after bound()"

    engine = LoRAEngine(transformer)
    path = write(adapter, tmp_path / "adapter.safetensors")
    engine.attach(load_adapter(path, shapes=tiny_shapes()), LoRASettings(source=str(path), alpha=alpha), "demo")
    try:
        with torch.no_grad():
            applied = velocity(setting)  # the app's inference path
        at_fallback = None
        if alpha is not None:  # the Turbo file stores no alpha: the rank fallback is 16x the trained update
            engine.set_lora("demo", alpha=float(recipe.TURBO_RANK))
            with torch.no_grad():
                at_fallback = velocity(setting)
    finally:
        engine.detach()
    assert not torch.equal(trained[0], base[0]), "the adapter changed nothing: the check would be empty"
    assert torch.equal(trained[0].detach(), applied[0]) and torch.equal(trained[1].detach(), applied[1])
    if at_fallback is not None:
        assert not torch.equal(at_fallback[0], applied[0])


def test_bound_puts_the_original_linears_back_after_an_error(setting):
    transformer = setting[0]
    before = dict(transformer.named_modules())
    adapter = TrainingLora.start(transformer, 4, 2.0, seed=5)
    with pytest.raises(RuntimeError, match="stop"), adapter.bound(transformer):
        assert isinstance(transformer.get_submodule(next(iter(adapter.factors))), LoRALinear)
        raise RuntimeError("stop")
    after = dict(transformer.named_modules())
    assert after.keys() == before.keys() and all(after[name] is module for name, module in before.items())


def test_a_finished_stage_saves_and_loads_its_factors(setting, tmp_path):
    adapter = trained_lora(setting[0], 4, 2.0)
    adapter.save(tmp_path / "style.pt")
    again = TrainingLora.load(tmp_path / "style.pt")
    assert (again.rank, again.alpha) == (4, 2.0) and again.factors.keys() == adapter.factors.keys()
    assert all(torch.equal(a, b) and torch.equal(c, d) and b.requires_grad and d.requires_grad
               for (a, c), (b, d) in zip(adapter.factors.values(), again.factors.values()))
