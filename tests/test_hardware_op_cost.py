"""The per-op term of the time model: every op that does work is counted once per phase on the rehearsal, each costs
``Peaks.op_overhead_s`` beside its FLOPs and bytes (measured on a CPU, a kernel launch on a GPU), and the planner's
rehearsals are kept in a bounded LRU — each held against arithmetic of the test's own."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from h3app.hardware import planner, roofline
from h3app.hardware.estimate import SMALL_BLOCK_OPS, _SmallBlock, cpu_peaks, op_overhead
from h3app.hardware.fake_cuda import PhaseBytes, fake_cuda
from h3app.hardware.flavors import BY_NAME
from h3app.hardware.planner import Measured, Placement
from h3app.hardware.rehearsal import Rehearsal, RehearsalOptions
from h3app.hardware.work import BASE, LORA, counting
from h3app.lru import LRU

EVALUATIONS = 4
FLOPS = {"denoise": {BASE: {"bfloat16": 4 * 10**15}, LORA: {"bfloat16": 10**13}},
         "vae_decode": {BASE: {"float32": 10**15}}}
MOVED = {"denoise": {BASE: 8 * 10**11}, "vae_decode": {BASE: 3 * 10**12}}
OPS = {"denoise": {BASE: 4000 * EVALUATIONS, LORA: 300 * EVALUATIONS}, "vae_decode": {BASE: 900},
       "audio_vae_decode": {BASE: 250}}


def test_every_op_that_does_work_is_counted_once_in_its_phase_and_kind():
    with fake_cuda() as mode:
        with counting(mode.counter) as work:
            x = torch.zeros(64, 32, device="cuda")  # a fill: 1
            with mode.counter.phase("vae_decode"):
                y = (x * 2.0).to(torch.bfloat16)  # a multiply, a cast: 2
                y.view(32, 64).t()  # views launch nothing
                torch.empty(8, 8, device="cuda")  # uninitialised memory: nothing
            with mode.counter.phase("denoise"):
                w = torch.zeros(32, 32, device="cuda")  # a fill: 1
                x @ w  # a matmul: 1
                work.kind = LORA
                x + x  # an add filed under the LoRA delta: 1
                work.kind = BASE
    assert work.ops_by_phase() == {"other": {BASE: 1}, "vae_decode": {BASE: 2}, "denoise": {BASE: 2, LORA: 1}}


def test_a_replayed_layer_repeats_its_recorded_ops():
    from h3app.hardware.replay import replay_repeats

    blocks = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.SiLU()).to("meta") for _ in range(3)]
    with fake_cuda() as mode:
        blocks = [block.to_empty(device="cuda") for block in blocks]
        undo = replay_repeats(blocks, mode.counter)
        try:
            with counting(mode.counter) as work, mode.counter.phase("denoise"):
                x = torch.empty(4, 8, device="cuda")
                for block in blocks:
                    x = block(x)
        finally:
            undo()
    one = work.ops_by_phase()["denoise"][BASE]
    assert one % 3 == 0 and one >= 3 * 2  # each block's matmul and activation, the two replays counted like the first


def _measured(ops):
    weights = {"transformer": 60 * 10**9, "text_encoder": 60 * 10**9, "vae": 10 * 10**9, "audio_vae": 6 * 10**8}
    rehearsal = Rehearsal(options=RehearsalOptions(), components=weights, host_components={}, lora_bytes=0,
                          pristine_host_bytes=0, phases={"denoise": PhaseBytes(0, 1)}, device_peak=1, host_peak=1,
                          tokens={}, targets_bound=0, evaluations=EVALUATIONS, video_shape=(), audio_shape=(),
                          flops=FLOPS, moved=MOVED, ops=ops, scheduler_shift=3.0)
    return Measured(rehearsal=rehearsal, weights=weights, fp8_transformer_bytes=30 * 10**9, largest_linear_bytes=1,
                    block_bytes=10**9, lora_bytes=0, num_layers=50)


def test_without_an_overhead_the_prediction_is_the_roofline_alone():
    h200 = roofline.PEAKS["H200"]
    free = dataclasses.replace(h200, op_overhead_s=0.0)
    step = roofline.step_seconds(_measured(OPS), Placement(), free, None)
    gemm, memory = 989.4e12 * roofline.GEMM_EFFICIENCY, 4.8e12 * roofline.MEMORY_EFFICIENCY
    roof = max(10**15 / gemm, 60 * 10**9 / memory) + 2 * 10**11 / memory  # per evaluation
    assert step == pytest.approx(roof, rel=1e-12)
    assert step == roofline.step_seconds(_measured({}), Placement(), h200, None)  # no ops counted: no term


@pytest.mark.parametrize("lora", [None, "unmerged"])
def test_each_op_adds_its_overhead_to_the_step_exactly(lora):
    overhead = 7e-6
    free = dataclasses.replace(roofline.PEAKS["H200"], op_overhead_s=0.0)
    costly = dataclasses.replace(free, op_overhead_s=overhead)
    before = roofline.step_seconds(_measured(OPS), Placement(), free, lora)
    after = roofline.step_seconds(_measured(OPS), Placement(), costly, lora)
    ops = 4000 + (300 if lora == "unmerged" else 0)  # per evaluation; the delta's ops only when it runs
    assert after - before == pytest.approx(ops * overhead, rel=1e-9)
    # every rank launches every op: context parallel splits FLOPs and bytes, not the per-op term
    two = Placement(ranks=2)
    assert roofline.step_seconds(_measured(OPS), two, costly, lora) - roofline.step_seconds(
        _measured(OPS), two, free, lora) == pytest.approx(ops * overhead, rel=1e-9)


def test_the_once_per_request_phases_and_the_video_carry_the_term():
    costly = dataclasses.replace(roofline.PEAKS["H200"], op_overhead_s=1e-4)
    measured = _measured(OPS)
    with_ops = roofline.predict_one(measured, Placement(), None, BY_NAME["h200"], steps=30, peaks=costly)
    without = roofline.predict_one(measured, Placement(), None, BY_NAME["h200"], steps=30,
                                   peaks=dataclasses.replace(costly, op_overhead_s=0.0))
    assert with_ops["decode_s"] - without["decode_s"] == pytest.approx((900 + 250) * 1e-4, abs=2e-3)
    assert with_ops["step_s"] - without["step_s"] == pytest.approx(4000 * 1e-4, abs=1e-4)


def test_a_gpu_pays_the_documented_launch_and_a_cpu_its_measured_op_cost():
    assert all(peaks.op_overhead_s == roofline.LAUNCH_OVERHEAD_S for peaks in roofline.PEAKS.values())
    assert 1e-6 <= roofline.LAUNCH_OVERHEAD_S <= 1e-5  # "a few microseconds" (docs/hardware.md's sources)
    measured = op_overhead()
    assert math.isfinite(measured) and measured > 0


@pytest.mark.slow
def test_the_cpu_peaks_carry_the_measured_op_cost(monkeypatch):
    from h3app.hardware import estimate

    monkeypatch.setattr(estimate, "op_overhead", lambda: 3.25e-5)
    assert cpu_peaks().op_overhead_s == 3.25e-5


def test_the_small_block_runs_the_ops_it_says():
    from torch.utils._python_dispatch import TorchDispatchMode

    ran = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ran.append(func)
            return func(*args, **(kwargs or {}))

    block, x = _SmallBlock().eval(), torch.randn(4, 32)
    with torch.inference_mode(), Seen():
        block(x)
    assert len([func for func in ran if not func.is_view]) == SMALL_BLOCK_OPS


def test_the_planner_keeps_a_bounded_number_of_rehearsals(monkeypatch):
    assert isinstance(planner._MEASURED, LRU) and planner._MEASURED.budget == planner.MEASURED_ENTRIES
    made = []

    def rehearse(options, model):
        made.append(options.size)
        return object()

    monkeypatch.setattr(planner, "_measure", rehearse)
    monkeypatch.setattr(planner, "_MEASURED", LRU(planner.MEASURED_ENTRIES))  # the session's rehearsals stay put
    sizes = [(64, 96 + 16 * i) for i in range(planner.MEASURED_ENTRIES + 1)]
    first = planner.measure(RehearsalOptions(size=sizes[0]), "tiny")
    assert planner.measure(RehearsalOptions(size=sizes[0]), "tiny") is first and len(made) == 1  # kept
    for size in sizes[1:]:
        planner.measure(RehearsalOptions(size=size), "tiny")
    assert len(planner._MEASURED) == planner.MEASURED_ENTRIES  # a new canvas past the bound evicts the oldest
    planner.measure(RehearsalOptions(size=sizes[0]), "tiny")
    assert made.count(sizes[0]) == 2 and len(planner._MEASURED) == planner.MEASURED_ENTRIES
