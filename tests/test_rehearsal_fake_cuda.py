"""Fake CUDA itself: device mistakes raise, bytes are counted, small values are known, attention is fused; and
h3app's own pipeline (the tiny checkpoint) runs through the worker on it — generation and the equivalence check —
with planted device bugs caught."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

from h3app.hardware.fake_cuda import fake_cuda
from h3app.hardware.header_adapter import lightx2v_header
from h3app.hardware.rehearsal import RehearsalOptions, rehearse
from h3app.model import repo
from h3app.model.loader import _load_components
from h3app.rules.h3_modules import transformer_shapes


def test_a_cpu_tensor_meeting_a_cuda_weight_raises():
    with fake_cuda():
        layer = torch.nn.Linear(8, 8, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(RuntimeError, match="device"):
            layer(torch.ones(2, 8, dtype=torch.bfloat16))


def test_a_dtype_mismatch_raises():
    with fake_cuda():
        layer = torch.nn.Linear(8, 8, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(RuntimeError, match="dtype|Half|BFloat16|Float"):
            layer(torch.ones(2, 8, device="cuda"))


def test_device_bytes_are_counted_and_released():
    with fake_cuda() as mode:
        counter = mode.counter
        before = counter.device_live
        with counter.phase("work"):
            big = torch.empty(1024, 1024, device="cuda", dtype=torch.bfloat16)
            view = big[:10]  # a view shares the storage: counted once
            assert counter.device_live - before == 2 * 1024 * 1024
            del big, view
        assert counter.device_live == before
        assert counter.phases["work"].transient == 2 * 1024 * 1024
        assert isinstance(torch.zeros(3, device="cuda"), FakeTensor)
        assert not isinstance(torch.zeros(3), FakeTensor)  # CPU work stays real


def test_small_values_are_known_so_data_dependent_code_runs():
    with fake_cuda():
        steps = torch.tensor([1.0, 0.5, 0.5, 0.0]).to("cuda")
        assert int((steps == 0.5).nonzero().shape[0]) == 2
        assert steps.unique_consecutive().shape == (3,)
        assert float(steps[1]) == 0.5


def test_attention_is_the_fused_kernel_not_the_quadratic_math_path():
    length, heads = 4096, 4
    with fake_cuda() as mode:
        q = torch.empty(1, heads, length, 64, device="cuda", dtype=torch.bfloat16)
        start = mode.counter.device_live
        with mode.counter.phase("attention"):
            out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        assert out.shape == q.shape and out.device.type == "cuda"
        scores = heads * length * length * 4
        assert mode.counter.phases["attention"].peak - start < scores / 8


TINY_CANVAS = (64, 96)  # the tiny checkpoint's largest canvas is 6,144 pixels


def _tiny(workflow: str = "t2va", **kwargs) -> RehearsalOptions:
    return RehearsalOptions(workflow=workflow, size=TINY_CANVAS, **kwargs)


def _tiny_rehearsal(options: RehearsalOptions):
    return rehearse(options, component_source=_load_components, location=repo.locate(repo.TINY, options.workflow),
                    pipeline_config=None)


@pytest.fixture(scope="module")
def tiny_header():
    config = repo.read_transformer_config(repo.TINY)
    return lightx2v_header(transformer_shapes(config), rank=4, dtype=torch.float32, alpha=2.0)


@pytest.mark.slow
@pytest.mark.parametrize("workflow", ["t2va", "fl2va", "ref2va"])
def test_the_tiny_pipeline_runs_on_fake_cuda_through_the_worker(workflow, tiny_header):
    result = _tiny_rehearsal(_tiny(workflow, dtype=torch.float32, adapter=tiny_header))
    assert result.evaluations == 1
    assert result.video_shape[1:] == (*TINY_CANVAS, 3)
    assert result.audio_shape[0] == 2
    assert result.tokens["video"] > 0 and result.tokens["audio"] > 0
    assert result.targets_bound == 6 * (2 + 2)  # q, k, v, out, ff in, ff out × (2 blocks + 2 refiner blocks)
    assert result.components[repo.partition_for(workflow)] > 0
    assert {"denoise", "vae_decode", "audio_vae_decode", "text_encoder"} <= set(result.phases)


@pytest.mark.slow
def test_a_planted_device_bug_in_the_lora_path_is_caught(monkeypatch, tiny_header):
    """LoRA factors left on the host while the weights sit on the GPU: fine on a CPU, fatal on a GPU — and here."""
    import h3app.hardware.rehearsal as rehearsal_module

    engine = rehearsal_module.LoRAEngine
    monkeypatch.setattr(rehearsal_module, "LoRAEngine", lambda model, **kw: engine(model, **{**kw, "device": "cpu"}))
    with pytest.raises(RuntimeError, match="device"):
        _tiny_rehearsal(_tiny(dtype=torch.float32, adapter=tiny_header))


@pytest.mark.slow
def test_merged_mode_on_fused_qkv_keeps_pristine_copies_on_the_host(tiny_header):
    result = _tiny_rehearsal(_tiny("fl2va", dtype=torch.float32, adapter=tiny_header, lora_mode="merged",
                                   fuse_qkv=True))
    assert result.targets_bound == 24
    assert result.pristine_host_bytes > 0


@pytest.mark.slow
def test_the_equivalence_check_runs_on_fake_cuda_and_does_not_pretend_to_compare(tiny_header):
    result = _tiny_rehearsal(_tiny(dtype=torch.float32, adapter=tiny_header, equivalence=True))
    check = result.check
    assert check.phases == ("fallback", "A", "control", "B")
    assert check.evaluations == result.evaluations == 3 * 1 + 1  # three one-step runs and the control step
    assert check.targets_bound == 24 and check.lora_bytes > 0
    # alpha × strength / rank (rank 4): A 8 × 1 / 4 and B 128 × 0.0625 / 4; the fallback alpha = rank, strength 1
    assert check.effective_scale_a == check.effective_scale_b == 2.0 and check.effective_scale_fallback == 1.0
    assert "not measurable on fake tensors" in check.comparison and "identical" not in check.to_json()
    assert result.video_shape == () and result.audio_shape == ()  # no output values are reported
    assert {"denoise", "vae_decode", "audio_vae_decode", "text_encoder"} <= set(result.phases)


@pytest.mark.slow
def test_a_planted_device_bug_in_the_check_b_run_is_caught(monkeypatch, tiny_header):
    """B's re-scale leaving a factor on the host (A ran fine): only a GPU — and fake CUDA — refuses it."""
    from h3app.lora.engine import LoRAEngine
    from h3app.lora.layers import LoRALinear

    set_lora = LoRAEngine.set_lora

    def rescale_on_the_host(engine, name, **kwargs):
        settings = set_lora(engine, name, **kwargs)
        for module in engine.transformer.modules():
            if isinstance(module, LoRALinear):
                for entry in module.lora_entries:
                    entry.down = entry.down.to("cpu")
        return settings

    monkeypatch.setattr(LoRAEngine, "set_lora", rescale_on_the_host)
    with pytest.raises(RuntimeError, match="device"):
        _tiny_rehearsal(_tiny(dtype=torch.float32, adapter=tiny_header, equivalence=True))


class _Clips(torch.nn.Module):
    """A decoder shaped like the video VAE's: ``decode`` cuts its input into clips, ``decode_clip`` runs each clip's
    tiles through identical layers — replayed calls nested inside a replayed call."""

    def __init__(self) -> None:
        super().__init__()
        self.tiles = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU())
                                         for _ in range(3))

    def decode_clip(self, clip: torch.Tensor) -> torch.Tensor:
        return torch.cat([tile(clip) for tile in self.tiles], dim=0)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.decode_clip(clip) for clip in x.split(4)], dim=0)


def _counted_decode(replayed: bool):
    from h3app.hardware.replay import replay_calls
    from h3app.hardware.work import counting

    with fake_cuda() as mode:
        model = _Clips().to("cuda")
        undo = replay_calls([(model, "decode_clip"), *((tile, "forward") for tile in model.tiles)],
                            mode.counter) if replayed else (lambda: None)
        try:
            with counting(mode.counter) as work, mode.counter.phase("vae_decode"), torch.no_grad():
                out = model.decode(torch.empty(16, 8, device="cuda"))
        finally:
            undo()
        return tuple(out.shape), mode.counter.device_peak, mode.counter.phases["vae_decode"], work.by_phase(), \
            work.moved_by_phase(), work.ops_by_phase()


def test_replayed_calls_nested_in_a_replayed_call_count_what_running_them_counts():
    shape, peak, phase, flops, moved, ops = _counted_decode(replayed=True)
    assert shape == (48, 16) and ops["vae_decode"]
    assert (shape, peak, phase, flops, moved, ops) == _counted_decode(replayed=False)


@pytest.mark.slow
def test_a_tiny_rehearsal_counts_the_same_without_its_shortcuts(monkeypatch):
    """Replay (identical layers, the video VAE's clips and tiles, the audio decoder's activations) and torch's fake
    dispatch cache only save time: every byte, FLOP and op of a 5 s tiny clip (seven VAE clips of one shape)
    equals running each call for real and dispatching each op afresh."""
    from h3app.hardware import fake_cuda as fake_cuda_module
    from h3app.hardware import rehearsal

    def numbers():
        result = _tiny_rehearsal(_tiny())
        return (result.device_peak, result.host_peak, {k: (v.start, v.peak) for k, v in result.phases.items()},
                result.flops, result.moved, result.ops, result.video_shape, result.audio_shape)

    shortcut = numbers()
    monkeypatch.setattr(rehearsal, "replay_calls", lambda methods, counter: lambda: None)
    monkeypatch.setattr(fake_cuda_module, "DISPATCH_CACHE", False)
    assert shortcut == numbers()
