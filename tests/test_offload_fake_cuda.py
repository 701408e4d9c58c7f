"""The CUDA-only placements (``--offload auto``, ``--offload group``) run through ``generate`` on the tiny model on
a fake GPU box (``h3app/hardware/fake_driver.py``): diffusers' own offload hooks move the components and blocks
between host and fake device, and the test watches where every component is while the pipeline runs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from cli_runner import run_cli

from h3app.hardware.fake_cuda import HOST_FAKE_ELEMENTS, is_fake
from h3app.hardware.fake_driver import FakeGpuBox, fake_gpu_box
from h3app.hardware.flavors import BY_NAME
from h3app.rules.steps import evaluations

pytestmark = pytest.mark.slow  # every test here runs generate on a fake GPU box

PROMPT = "a red ball moving right over a grey floor, low loud hum"
STEPS = 3
BOX = BY_NAME["a100-large"]  # the plan's recommended flavor for the request (tests/test_fp8_runtime.py)


def device_of(module: torch.nn.Module) -> str:
    return next(module.parameters()).device.type


@dataclass
class Trace:
    """Where the loaded components were: after loading, during each transformer call, and at the end."""

    model: Any = None
    after_load: dict[str, str] = field(default_factory=dict)
    hooks: dict[str, Any] = field(default_factory=dict)  # component → the offload hook it had after loading
    during_denoise: list[dict[str, str]] = field(default_factory=list)
    text_encoder_ran_on: list[str] = field(default_factory=list)
    output_devices: set[str] = field(default_factory=set)
    # (index of the transformer block computing, every block's device then); every block's device after each call
    blocks_computing: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    blocks_after_call: list[tuple[str, ...]] = field(default_factory=list)

    def where(self) -> dict[str, str]:
        return {name: device_of(c) for name, c in self.model.components.items() if isinstance(c, torch.nn.Module)}


def _watch(trace: Trace, loaded: Any) -> None:
    """Hooks that record placements as the pipeline runs (outside diffusers' own hooks: they see what those did)."""
    trace.model = loaded
    trace.after_load = trace.where()
    trace.hooks = {name: getattr(c, "_hf_hook", None) for name, c in loaded.components.items()
                   if isinstance(c, torch.nn.Module)}
    transformer = loaded.components["transformer"]

    blocks = transformer.transformer_blocks

    def denoised(module, args, output) -> None:
        trace.during_denoise.append(trace.where())
        trace.blocks_after_call.append(tuple(device_of(b) for b in blocks))
        trace.output_devices.update(t.device.type for t in torch.utils._pytree.tree_leaves(output)
                                    if isinstance(t, torch.Tensor))

    transformer.register_forward_hook(denoised)
    encoder = loaded.components["text_encoder"]
    encoder.model.register_forward_hook(lambda m, a, o: trace.text_encoder_ran_on.append(device_of(encoder)))
    for index, block in enumerate(blocks):
        first = next(m for m in block.modules() if isinstance(m, torch.nn.Linear))
        first.register_forward_pre_hook(
            lambda m, a, index=index: trace.blocks_computing.append((index, tuple(device_of(b) for b in blocks))))


def run_generate_on_box(capsys, monkeypatch, tmp_path, options: list[str], gpu_bytes: int,
                        after_load=None) -> tuple[dict, Trace, FakeGpuBox]:
    """``generate --device cuda OPTIONS`` on the tiny model inside a fake GPU box of ``gpu_bytes``; ``after_load``
    (trace, box) runs once the model is placed, before the first job."""
    from h3app.backend import service

    trace = Trace()
    original = service.load_model

    def spy(*args: Any, **kwargs: Any) -> Any:
        loaded = original(*args, **kwargs)
        _watch(trace, loaded)
        if after_load is not None:
            after_load(trace, box)
        return loaded

    monkeypatch.setattr(service, "load_model", spy)
    out = tmp_path / "offload.mp4"
    with fake_gpu_box(gpu_bytes) as box:
        result = run_cli(capsys, "generate", "--model", "tiny", "--prompt", PROMPT, "--steps", str(STEPS),
                         "--out", str(out), "--json", "--device", "cuda", *options)
    assert result.code == 0, result.err
    assert out.stat().st_size > 0
    return json.loads(result.out), trace, box


def assert_ran_every_evaluation_on_the_device(result: dict, trace: Trace) -> None:
    assert result["evaluations"] == evaluations(STEPS) == len(trace.during_denoise)
    assert trace.output_devices == {"cuda"}


def test_auto_offload_places_every_component_on_the_host_and_moves_each_in_when_it_runs(capsys, monkeypatch,
                                                                                         tmp_path):
    from diffusers.modular_pipelines.components_manager import CustomOffloadHook

    result, trace, box = run_generate_on_box(capsys, monkeypatch, tmp_path, ["--offload", "auto"], BOX.gpu_bytes)
    assert set(trace.after_load.values()) == {"cpu"}  # offloaded at load, not .to("cuda")
    assert trace.hooks.keys() == {"transformer", "text_encoder", "vae", "audio_vae"}
    assert all(isinstance(hook, CustomOffloadHook) and hook.execution_device == torch.device("cuda", 0)
               for hook in trace.hooks.values())
    assert_ran_every_evaluation_on_the_device(result, trace)
    assert trace.text_encoder_ran_on == ["cuda"]
    assert all(where["transformer"] == "cuda" for where in trace.during_denoise)
    assert set(trace.where().values()) == {"cuda"}  # 80 GB: every component moved in and none had to leave
    assert box.log.calls["mem_get_info"] > 0  # the strategy asked the (fake) driver for free memory


def test_auto_offload_moves_the_text_encoder_out_when_the_gpu_only_holds_one_component(capsys, monkeypatch,
                                                                                       tmp_path):
    from diffusers.modular_pipelines.components_manager import AutoOffloadStrategy

    def shrink(trace: Trace, box: FakeGpuBox) -> None:
        footprint = {n: c.get_memory_footprint() for n, c in trace.model.components.items()
                     if isinstance(c, torch.nn.Module)}
        # diffusers keeps its reserve free; above it there is room for the transformer and half the text encoder
        box.gpu_bytes = (AutoOffloadStrategy().memory_reserve_margin + footprint["transformer"]
                         + footprint["text_encoder"] // 2)

    result, trace, _ = run_generate_on_box(capsys, monkeypatch, tmp_path, ["--offload", "auto"], BOX.gpu_bytes,
                                           after_load=shrink)
    assert_ran_every_evaluation_on_the_device(result, trace)
    assert trace.text_encoder_ran_on == ["cuda"]
    assert all(where["transformer"] == "cuda" and where["text_encoder"] == "cpu" for where in trace.during_denoise)


@pytest.mark.parametrize("fp8", [[], ["--fp8", "--fp8-text-encoder"]], ids=["bf16-weights", "fp8"])
def test_group_offload_streams_the_transformer_blocks_through_the_device_one_at_a_time(capsys, monkeypatch,
                                                                                      tmp_path, fp8):
    result, trace, box = run_generate_on_box(capsys, monkeypatch, tmp_path, ["--offload", "group", *fp8],
                                             BOX.gpu_bytes)
    assert set(trace.after_load.values()) == {"cpu"}
    assert_ran_every_evaluation_on_the_device(result, trace)
    blocks = len(trace.model.components["transformer"].transformer_blocks)
    assert [index for index, _ in trace.blocks_computing] == list(range(blocks)) * len(trace.during_denoise)
    for index, devices in trace.blocks_computing:
        assert devices[index] == "cuda"  # onloaded to compute
        assert set(devices[:index]) <= {"cpu"}  # the blocks before it went back to the host
        assert devices[index + 1:].count("cuda") <= 1  # at most the next one prefetched
    assert all(set(devices) == {"cpu"} for devices in trace.blocks_after_call)
    assert box.log.moves[("cpu", "cuda")] > 0 and box.log.moves[("cuda", "cpu")] > 0
    assert box.log.calls["Stream"] == 1 and box.log.calls["pin_memory"] > 0  # the side stream, pinned host copies
    if fp8:
        linear = next(m for m in trace.model.components["transformer"].transformer_blocks.modules()
                      if isinstance(m, torch.nn.Linear))
        assert linear.weight.dtype == torch.float8_e4m3fn


def test_the_box_restores_the_driver_and_the_tensor_methods_on_exit_even_after_an_error():
    from h3app.backend.worker import Worker

    def current():
        return (torch.cuda.is_available, torch.cuda.mem_get_info, torch.cuda.Stream, torch.utils.swap_tensors,
                Worker._loop)

    originals = current()
    with pytest.raises(RuntimeError, match="planted"):
        with fake_gpu_box(10**9):
            assert torch.cuda.is_available() and torch.cuda.mem_get_info() == (10**9, 10**9)
            held = torch.empty(1000, device="cuda")
            assert is_fake(held) and torch.cuda.mem_get_info()[0] == 10**9 - 4000
            raise RuntimeError("planted")
    assert current() == originals
    assert not is_fake(torch.empty(HOST_FAKE_ELEMENTS + 1))  # a host tensor this large would be fake inside the box
