"""The decode predicted as it runs, and a video's time as the sum of its terms: memory-bound ops counted as the
bytes they move, each decoder op in the precision it runs in (``--vae-dtype``), a cached run predicted from the
measured share of skipped evaluations — each held against arithmetic of the test's own."""

from __future__ import annotations

import pytest
import torch

from h3app.hardware import roofline
from h3app.hardware.fake_cuda import PhaseBytes, fake_cuda
from h3app.hardware.flavors import BY_NAME
from h3app.hardware.judge import Setup, default_request, judge
from h3app.hardware.planner import Measured, Placement, measure
from h3app.hardware.rehearsal import Rehearsal, RehearsalOptions
from h3app.hardware.work import BASE, bytes_moved, counting
from h3app.model import repo
from h3app.model.denoise_cache import MEASURED_SKIP_SHARE

# RTX PRO 6000 (Blackwell server edition) datasheet figures the roofline uses: bf16 500, fp32 125 TFLOPS, 1.792 TB/s;
# GEMMs reach GEMM of a peak, streaming ops MEM of the bandwidth (the model's published shares).
GEMM, MEM = roofline.GEMM_EFFICIENCY, roofline.MEMORY_EFFICIENCY
RTX_BF16, RTX_FP32, RTX_HBM = 500e12 * GEMM, 125e12 * GEMM, 1.792e12 * MEM


def test_an_elementwise_op_moves_its_inputs_and_output_and_a_view_nothing():
    rows, width = 64, 32
    with fake_cuda() as mode:
        with mode.counter.phase("vae_decode"), counting(mode.counter) as work:
            x = torch.zeros(rows, width, device="cuda", dtype=torch.bfloat16)
            y = (x.float() * 2.0).to(torch.bfloat16)  # a cast up, a multiply, a cast down
            y.view(width, rows).t()  # views: no bytes
            torch.zeros(rows, width, device="cuda") @ torch.zeros(width, width, device="cuda")  # FLOPs, not moved
    n = rows * width
    cast_up, multiply, cast_down = n * 2 + n * 4, n * 4 + n * 4, n * 4 + n * 2
    zeros = n * 2 + n * 4 + width * width * 4  # three zero fills written: x (bf16), the fp32 rows, the matrix
    assert work.moved_by_phase() == {"vae_decode": {BASE: cast_up + multiply + cast_down + zeros}}
    assert work.by_phase()["vae_decode"][BASE] == {"float32": 2 * rows * width * width}


def test_gathers_move_their_output_twice_and_empty_memory_moves_nothing():
    with fake_cuda():
        table = torch.empty(1000, 16, device="cuda")
        ids = torch.zeros(8, dtype=torch.long, device="cuda")
        out = torch.nn.functional.embedding(ids, table)
        packet = torch.ops.aten.embedding
        assert bytes_moved(packet, (table, ids), {}, out) == 2 * 8 * 16 * 4
        assert bytes_moved(torch.ops.aten.empty, ((4, 4),), {"device": "cuda"}, table) == 0
        assert bytes_moved(torch.ops.prim.device, (table,), {}, table.device) == 0  # metadata: no tensor comes out


def _measured(flops, moved, evaluations=4, layers=50):
    weights = {"transformer": 60 * 10**9, "text_encoder": 60 * 10**9, "vae": 10 * 10**9, "audio_vae": 6 * 10**8}
    rehearsal = Rehearsal(options=RehearsalOptions(), components=weights, host_components={}, lora_bytes=0,
                          pristine_host_bytes=0, phases={"denoise": PhaseBytes(0, 1)}, device_peak=1, host_peak=1,
                          tokens={}, targets_bound=0, evaluations=evaluations, video_shape=(), audio_shape=(),
                          flops=flops, moved=moved, scheduler_shift=3.0)
    return Measured(rehearsal=rehearsal, weights=weights, fp8_transformer_bytes=30 * 10**9, largest_linear_bytes=1,
                    block_bytes=10**9, lora_bytes=0, num_layers=layers)


FLOPS = {"denoise": {BASE: {"bfloat16": 4 * 10**15}}, "text_encoder": {BASE: {"bfloat16": 10**13}},
         "vae_decode": {BASE: {"float32": 10**15, "tf32": 10**9}}, "audio_vae_decode": {BASE: {"tf32": 5 * 10**11}}}
MOVED = {"denoise": {BASE: 8 * 10**11}, "vae_decode": {BASE: 3 * 10**12}, "audio_vae_decode": {BASE: 10**10}}


def test_the_video_is_the_sum_of_its_terms_and_the_decode_counts_its_moved_bytes():
    measured = _measured(FLOPS, MOVED)
    out = roofline.predict_one(measured, Placement("none"), None, BY_NAME["rtx-pro-6000"], steps=30)
    rtx_tf32 = 250e12 * GEMM
    step = max(10**15 / RTX_BF16, 60 * 10**9 / RTX_HBM) + 2 * 10**11 / RTX_HBM
    video_decode = max(10**15 / RTX_FP32 + 10**9 / rtx_tf32, 10**10 / RTX_HBM) + 3 * 10**12 / RTX_HBM
    audio_decode = max(5 * 10**11 / rtx_tf32, 6 * 10**8 / RTX_HBM) + 10**10 / RTX_HBM
    text = max(10**13 / RTX_BF16, 60 * 10**9 / RTX_HBM)
    evaluations = roofline.request_evaluations(measured.rehearsal, 30)
    assert out["evaluations"] == evaluations == 29 and out["skipped"] == 0
    assert out["step_s"] == pytest.approx(step, abs=1e-4)
    assert out["decode_s"] == pytest.approx(video_decode + audio_decode, abs=1e-3)
    assert out["text_encoder_s"] == pytest.approx(text, abs=1e-3) and out["encode_s"] == out["transfer_s"] == 0
    assert out["video_s"] == pytest.approx(evaluations * out["step_s"] + out["text_encoder_s"] + out["encode_s"]
                                           + out["decode_s"] + out["transfer_s"], abs=0.02)


def test_a_cached_run_is_predicted_from_the_measured_share():
    measured = _measured(FLOPS, MOVED, layers=50)
    plain = roofline.predict_one(measured, Placement("none"), None, BY_NAME["h200"], steps=30)
    cached = roofline.predict_one(measured, Placement("none"), None, BY_NAME["h200"], steps=30, cache="fbc")
    skipped = round(MEASURED_SKIP_SHARE * 29)
    assert cached["skipped"] == skipped > 0 and cached["step_s"] == plain["step_s"]
    assert cached["skipped_step_s"] == pytest.approx(plain["step_s"] / 50, abs=1e-4)
    saved = skipped * (plain["step_s"] - plain["step_s"] / 50)
    assert cached["video_s"] == pytest.approx(plain["video_s"] - saved, abs=0.02)
    assert roofline.skipped_evaluations(1, "fbc") == 0  # the first evaluation has nothing to reuse


@pytest.mark.slow  # tiny rehearsals (two, a few seconds each)
def test_the_tiny_decoder_is_counted_in_the_precision_vae_dtype_runs_it_in():
    request = default_request(repo.TINY)
    fp32 = measure(RehearsalOptions(size=(request.height, request.width), vae_dtype=torch.float32),
                   repo.TINY).rehearsal
    bf16 = measure(RehearsalOptions(size=(request.height, request.width), vae_dtype=torch.bfloat16),
                   repo.TINY).rehearsal
    assert "float32" in fp32.flops["vae_decode"][BASE] and "bfloat16" not in fp32.flops["vae_decode"][BASE]
    assert bf16.flops["vae_decode"][BASE].get("bfloat16", 0) > 0.9 * sum(fp32.flops["vae_decode"][BASE].values())
    assert set(bf16.flops["audio_vae_decode"][BASE]) == set(fp32.flops["audio_vae_decode"][BASE])  # audio stays fp32
    assert fp32.flops["denoise"] == bf16.flops["denoise"]


@pytest.mark.slow  # tiny rehearsals (two, a few seconds each)
def test_the_judge_hands_the_request_cache_and_the_vae_dtype_to_the_prediction():
    request = default_request(repo.TINY)
    setup = Setup(model=repo.TINY, vae_dtype=torch.float32)
    plain = judge(request, Placement(), BY_NAME["h200"], setup).prediction
    import dataclasses

    cached = judge(dataclasses.replace(request, cache="fbc"), Placement(), BY_NAME["h200"], setup).prediction
    assert plain["skipped"] == 0 and cached["skipped"] == roofline.skipped_evaluations(plain["evaluations"], "fbc")
    bf16_setup = Setup(model=repo.TINY, vae_dtype=torch.bfloat16)
    bf16 = judge(request, Placement(), BY_NAME["h200"], bf16_setup).prediction
    assert bf16["step_s"] == plain["step_s"] and bf16["decode_s"] != plain["decode_s"]
    # the arithmetic alone (no per-op term: the tiny decoder's bf16 casts are extra launches that outweigh it)
    roof = dataclasses.replace(roofline.PEAKS["H200"], op_overhead_s=0.0)
    assert judge(request, Placement(), BY_NAME["h200"], bf16_setup, peaks=roof).prediction["decode_s"] <= \
        judge(request, Placement(), BY_NAME["h200"], setup, peaks=roof).prediction["decode_s"]
