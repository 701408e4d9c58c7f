"""Merged mode's pristine copies: host RAM or a local safetensors file mapped from disk (bitwise the same results),
refused with the reason when neither fits, and refused for quantised bases."""

import pytest
import torch
from lora_fixtures import (
    block_targets,
    build_tiny,
    fail_merge_at,
    forward,
    linear_shapes,
    make_adapter,
    module_types,
    state_hash,
)

from h3app.backend.transformer_check import packed_check_input
from h3app.errors import H3AppError
from h3app.lora import LoRAEngine, PristineStore
from h3app.lora.layers import is_mergeable
from h3app.settings import LoRASettings


@pytest.fixture(scope="module")
def setup():
    model = build_tiny()
    shapes = linear_shapes(model)
    return make_adapter(shapes, block_targets(shapes) + ["proj_out"], rank=4, alpha=4.0), packed_check_input(model.config, 1)


def _merge_change_detach(store, adapter, inputs, while_merged):
    """Attach merged, change alpha/strength and back, run a forward, call ``while_merged(engine)``, detach and check
    the weights are bitwise at base. Returns (outputs, state hash while merged)."""
    model = build_tiny()
    base = state_hash(model)
    engine = LoRAEngine(model, pristine=store)
    engine.attach(adapter, LoRASettings(source="s", mode="merged", strength=0.8), "a")
    engine.set_lora("a", alpha=64, strength=-0.3)
    engine.set_lora("a", alpha=None, strength=0.8)
    outputs, state = forward(model, inputs), state_hash(model)
    while_merged(engine)
    engine.detach()
    assert state_hash(model) == base
    return outputs, state


def test_disk_spilled_pristine_gives_bitwise_the_ram_results(setup, tmp_path):
    adapter, inputs = setup
    outputs, states = [], []
    for store in (PristineStore(prefer="ram"), PristineStore(tmp_path, prefer="disk")):
        def spilled(engine, store=store):
            if store.prefer == "disk":
                files = list(tmp_path.rglob("*.safetensors"))
                assert len(files) == len(engine._adapters["a"].entries) and store.ram_bytes == 0

        output, state = _merge_change_detach(store, adapter, inputs, spilled)
        outputs.append(output)
        states.append(state)
        if store.prefer == "disk":
            assert not list(tmp_path.rglob("*.safetensors"))
    assert states[0] == states[1]
    assert all(torch.equal(a, b) for a, b in zip(*outputs))


def test_auto_spills_to_disk_when_ram_is_short(setup, tmp_path):
    adapter, _ = setup
    store = PristineStore(tmp_path, available_ram=lambda: 1 << 20)  # 1 MiB free: below the margin
    engine = LoRAEngine(build_tiny(), pristine=store)
    engine.attach(adapter, LoRASettings(source="s", mode="merged"), "a")
    assert store.disk_keys and store.ram_bytes == 0


def test_merged_refused_when_neither_ram_nor_disk_fits(setup, tmp_path):
    adapter, inputs = setup
    model = build_tiny()
    before, types = state_hash(model), module_types(model)
    store = PristineStore(tmp_path, available_ram=lambda: 1 << 20, free_disk=lambda path: 1 << 20)
    engine = LoRAEngine(model, pristine=store)
    with pytest.raises(H3AppError, match="merged mode needs .* GiB for the pristine weights, but host RAM .* are both too small"):
        engine.attach(adapter, LoRASettings(source="s", mode="merged"), "a")
    assert state_hash(model) == before and module_types(model) == types and engine.active() == {}
    engine.attach(adapter, LoRASettings(source="s"), "a")  # unmerged needs no copy
    with pytest.raises(H3AppError, match="use unmerged mode"):
        engine.set_mode("merged")
    assert engine.mode == "unmerged" and len(store) == 0
    assert forward(model, inputs)[0].isfinite().all()


def test_quantised_or_meta_weights_are_unmerged_only():
    int8 = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.int8), requires_grad=False)
    assert "unmerged-only" in is_mergeable(int8)
    assert "meta device" in is_mergeable(torch.empty(2, 2, device="meta"))
    assert is_mergeable(torch.zeros(2, 2, dtype=torch.bfloat16)) is None


class _Int8Weight(torch.Tensor):
    """A quantised weight as torchao makes one: a traceable wrapper subclass holding int8 values and a scale."""

    @staticmethod
    def __new__(cls, qdata, scale):
        return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=torch.bfloat16, device=qdata.device)

    def __init__(self, qdata, scale):
        self.qdata, self.scale = qdata, scale

    def __tensor_flatten__(self):
        return ["qdata", "scale"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return _Int8Weight(inner["qdata"], inner["scale"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.detach.default:  # ``.data``
            return _Int8Weight(args[0].qdata, args[0].scale)
        raise NotImplementedError(str(func))


def test_a_tensor_subclass_of_another_layout_is_quantised_and_a_fake_tensor_is_not():
    from h3app.hardware.fake_cuda import fake_cuda
    from h3app.lora.layers import has_values

    quantised = _Int8Weight(torch.zeros(4, 4, dtype=torch.int8), torch.ones(4))
    assert "_Int8Weight (quantised)" in is_mergeable(quantised) and has_values(quantised)
    with fake_cuda():
        fake = torch.nn.Linear(4, 4).to("cuda").weight
        assert is_mergeable(fake) is None and not has_values(fake)
    assert not has_values(torch.empty(2, 2, device="meta")) and has_values(torch.zeros(2, 2))


def test_device_placement_gives_bitwise_the_ram_results_and_rolls_back(setup, monkeypatch):
    adapter, inputs = setup
    outputs, states = [], []
    for store in (PristineStore(prefer="ram"), PristineStore(prefer="device")):
        def placed(engine, store=store):
            held = {store.placement(key) for key in engine._adapters["a"].entries}
            assert held == {store.prefer}
            assert (store.device_bytes > 0 and store.ram_bytes == 0) if store.prefer == "device" else store.device_bytes == 0

        output, state = _merge_change_detach(store, adapter, inputs, placed)
        outputs.append(output)
        states.append(state)
        assert len(store) == 0
    assert states[0] == states[1]
    assert all(torch.equal(a, b) for a, b in zip(*outputs))

    # a failure half-way through a merge from device copies leaves the weights bitwise as they were
    model = build_tiny()
    store = PristineStore(prefer="device")
    engine = LoRAEngine(model, pristine=store)
    engine.attach(adapter, LoRASettings(source="s", mode="merged", strength=0.8), "a")
    before = state_hash(model)
    fail_merge_at(monkeypatch, 3, RuntimeError("injected"))
    with pytest.raises(RuntimeError, match="injected"):
        engine.set_lora("a", alpha=64, strength=-0.3)
    assert state_hash(model) == before and engine.active()["a"].strength == 0.8


def test_placement_follows_the_device_budget():
    cuda = torch.device("cuda")  # reserve only decides: nothing is allocated on the device here
    assert PristineStore(device_budget=1000, available_ram=lambda: None).reserve(800, cuda) == "device"
    assert PristineStore(device_budget=1000, available_ram=lambda: None).reserve(2000, cuda) == "ram"
    assert PristineStore(free_device=lambda device: 10_000).reserve(5000, cuda) == "device"
    assert PristineStore(free_device=lambda device: None, available_ram=lambda: None).reserve(5000, cuda) == "ram"
    assert PristineStore(available_ram=lambda: None).reserve(5000, torch.device("cpu")) == "ram"  # auto on the CPU
    with pytest.raises(H3AppError, match=r"pristine weights need .* on cuda but its budget leaves .*raise the device budget"):
        PristineStore(prefer="device", device_budget=1000).reserve(2000, cuda)
    store = PristineStore()
    store.set_placement("ram", device_budget=1 << 30)
    assert (store.prefer, store.device_budget) == ("ram", 1 << 30)
    with pytest.raises(H3AppError, match="placement must be one of auto, device, ram, disk"):
        store.set_placement("gpu")
    store.put("w", torch.zeros(2, 2))
    with pytest.raises(H3AppError, match="switch to unmerged mode first"):
        store.set_placement("device")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the streamed pinned-host path needs a CUDA device")
def test_pinned_host_copies_stream_bitwise_the_device_results(setup):
    adapter, inputs = setup
    states = []
    for prefer in ("device", "ram"):
        model = build_tiny().cuda()
        store = PristineStore(prefer=prefer)
        engine = LoRAEngine(model, pristine=store)
        engine.attach(adapter, LoRASettings(source="s", mode="merged", strength=0.8), "a")
        engine.set_lora("a", alpha=64, strength=-0.3)
        if prefer == "ram":
            assert all(store.full(key).is_pinned() for key in engine._adapters["a"].entries)
        states.append(state_hash(model))
    assert states[0] == states[1]
