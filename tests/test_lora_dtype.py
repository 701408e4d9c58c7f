"""Which dtype the unmerged delta runs in (``delta_dtype``): fp32 on the CPU, the base's half dtype on CUDA; the half
path forced on the CPU against its stated oracle tolerance, the equivalence pair on it, and fake-CUDA dtypes."""

import pytest
import torch
from lora_fixtures import build_tiny, forward, linear_shapes, make_adapter, same_bits

from h3app.backend.transformer_check import packed_check_input
from h3app.lora import LoRAEngine, LoRALinear
from h3app.lora import entries as entries_module
from h3app.lora.layers import LoRAFactors, delta_dtype
from h3app.lora.scaling import AdapterScale, ModuleAlpha
from h3app.settings import LoRASettings

HALF = (torch.bfloat16, torch.float16)


@pytest.mark.parametrize("base", [torch.bfloat16, torch.float16, torch.float32])
def test_policy_cuda_runs_half_bases_in_their_dtype_and_fp32_stays(base):
    assert delta_dtype("cuda", base) == base
    assert delta_dtype(torch.device("cuda", 0), base) == base


@pytest.mark.parametrize("base", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_policy_cuda_runs_an_fp8_stored_base_in_bf16(base):
    assert delta_dtype("cuda", base) == torch.bfloat16
    assert delta_dtype("cpu", base) == torch.float32


@pytest.mark.parametrize("base", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_policy_cpu_and_meta_keep_fp32(base):
    assert delta_dtype("cpu", base) == torch.float32
    assert delta_dtype("meta", base) == torch.float32


def _half_layer(dtype, seed=2, rank=8, strength=0.3, alpha=4.0):
    generator = torch.Generator().manual_seed(seed)
    linear = torch.nn.Linear(64, 48, bias=True).requires_grad_(False)
    linear.to(dtype)
    A64 = torch.randn(rank, 64, generator=generator, dtype=torch.float64) * 0.2
    B64 = torch.randn(48, rank, generator=generator, dtype=torch.float64) * 0.2
    state = AdapterScale((), alpha, strength, {})
    entry = state.entry_for("attention", (ModuleAlpha(alpha, rank),), torch.device("cpu"))
    layer = LoRALinear(linear)
    layer.add_entry(LoRAFactors("a", entry, A64.to(dtype), B64.to(dtype)))
    return layer, linear, A64.to(dtype).double(), B64.to(dtype).double(), entry


@pytest.mark.parametrize("dtype", HALF)
def test_forced_half_path_is_within_the_stated_oracle_tolerance(dtype):
    layer, linear, A, B, entry = _half_layer(dtype)
    x = (torch.randn(37, 64, generator=torch.Generator().manual_seed(7)) * 2).to(dtype)
    with torch.no_grad():
        got = layer(x)
        base = linear(x).double()
        delta = (x.double() @ A.T * entry.values[0]) @ B.T
    assert got.dtype == dtype and layer.lora_entries[0].dtype == dtype
    want = base + delta
    # The tolerance stated in h3app/lora/layers.py: 2⁻⁷ · (|base| + max|delta| of the row) + 2⁻²⁴.
    bound = 2.0 ** -7 * (base.abs() + delta.abs().amax(dim=-1, keepdim=True)) + 2.0 ** -24
    error = (got.double() - want).abs()
    assert bool((error <= bound).all()), float((error / bound).max())
    assert float(delta.abs().max()) > 0.1  # the delta is not negligible next to the base


def test_half_path_applies_the_fp32_scale_not_a_bf16_rounded_one():
    # 0.3 · 4/8 = 0.15 is not a bf16 value: a bf16-rounded scale (0.1499…) would move every delta element.
    layer, _, A, B, entry = _half_layer(torch.bfloat16, rank=8, strength=0.3, alpha=4.0)
    assert float(entry.applied) != float(entry.applied.to(torch.bfloat16))
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    factors = layer.lora_entries[0]
    hidden = torch.nn.functional.linear(x, factors.down)
    want = torch.nn.functional.linear((hidden.float() * entry.applied).to(torch.bfloat16), factors.up)
    assert torch.equal(factors.delta(x), want)


def _force_half(monkeypatch):
    """The CUDA branch of ``delta_dtype`` on the CPU: half bases keep their dtype."""
    monkeypatch.setattr(entries_module, "delta_dtype", lambda device, base: base if base in HALF else torch.float32)


@pytest.mark.parametrize("mode", ["unmerged", "merged"])
def test_equivalence_pair_bit_identical_on_the_half_path(monkeypatch, mode):
    _force_half(monkeypatch)
    model = build_tiny().to(torch.bfloat16)
    shapes = linear_shapes(model)
    inputs = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v)
              for k, v in packed_check_input(model.config, seed=0).items()}
    targets = [t for t in shapes if t != "time_embedder.linear_1"]
    engine = LoRAEngine(model)
    engine.attach(make_adapter(shapes, targets, rank=8, dtype=torch.bfloat16),
                  LoRASettings(source="synthetic", alpha=8, strength=1.0, mode=mode), "a")
    if mode == "unmerged":
        dtypes = {e.dtype for m in model.modules() if isinstance(m, LoRALinear) for e in m.lora_entries}
        assert dtypes == {torch.bfloat16}
    out_a = forward(model, inputs)
    engine.set_lora("a", alpha=128, strength=0.0625)
    assert same_bits(out_a, forward(model, inputs))
    engine.set_lora("a", alpha=8, strength=0.5)
    assert not same_bits(out_a, forward(model, inputs))


def test_fake_cuda_bf16_model_keeps_bf16_factors_and_output():
    from h3app.hardware.fake_cuda import fake_cuda

    model = build_tiny()
    shapes = linear_shapes(model)
    targets = [t for t in shapes if t != "time_embedder.linear_1"]
    adapter = make_adapter(shapes, targets, rank=4)  # fp32 factors in the file
    with fake_cuda():
        model = model.to(device="cuda", dtype=torch.bfloat16)
        engine = LoRAEngine(model)
        engine.attach(adapter, LoRASettings(source="synthetic", alpha=4, strength=1.0), "a")
        entries = [e for m in model.modules() if isinstance(m, LoRALinear) for e in m.lora_entries]
        assert entries and {(e.down.dtype, e.up.dtype, e.down.device.type) for e in entries} == \
            {(torch.bfloat16, torch.bfloat16, "cuda")}
        assert {e.scale.applied.dtype for e in entries} == {torch.float32}
        assert engine.factor_bytes == sum(m.down.numel() + m.up.numel() for m in adapter.modules.values()) * 2
        layer = next(m for m in model.modules() if isinstance(m, LoRALinear))
        with torch.no_grad():
            out = layer(torch.zeros(3, layer.in_features, dtype=torch.bfloat16, device="cuda"))
        assert out.dtype == torch.bfloat16 and out.device.type == "cuda"


def test_cpu_bf16_model_keeps_fp32_factors():
    model = build_tiny().to(torch.bfloat16)
    shapes = linear_shapes(model)
    adapter = make_adapter(shapes, [t for t in shapes if t != "time_embedder.linear_1"], rank=4)
    LoRAEngine(model).attach(adapter, LoRASettings(source="synthetic", alpha=4, strength=1.0), "a")
    dtypes = {e.dtype for m in model.modules() if isinstance(m, LoRALinear) for e in m.lora_entries}
    assert dtypes == {torch.float32}
