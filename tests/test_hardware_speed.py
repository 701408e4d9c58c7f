"""Speed before renting: FLOPs counted on fake CUDA (work.py), the roofline per flavor (roofline.py) and the plan's
``flops_per_evaluation`` / ``predicted`` fields, each checked against arithmetic of the test's own."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from rehearsal_fixtures import tiny_lightx2v_options

from h3app.hardware import roofline
from h3app.hardware.fake_cuda import PhaseBytes, fake_cuda
from h3app.hardware.flavors import BY_NAME
from h3app.hardware.judge import Setup, default_request
from h3app.hardware.planner import Measured, Placement, measure
from h3app.hardware.recommend import make_plan
from h3app.hardware.rehearsal import Rehearsal, RehearsalOptions
from h3app.hardware.replay import replay_repeats
from h3app.hardware.summary import describe_plan
from h3app.hardware.work import BASE, LORA, counting
from h3app.lora.layers import LoRAFactors, LoRALinear
from h3app.lora.scaling import AdapterScale, ModuleAlpha
from h3app.model import repo

# H200 SXM datasheet, dense: bf16 989.4 TFLOPS, fp32 66.9 TFLOPS, HBM 4.8 TB/s; PCIe 5 x16 64 GB/s one way; NVLink 4
# 450 GB/s one way. GEMMs reach GEMM of a peak, streaming ops MEM of the bandwidth (the model's published shares).
GEMM, MEM = roofline.GEMM_EFFICIENCY, roofline.MEMORY_EFFICIENCY
H200_BF16, H200_FP32, H200_HBM, H200_HOST = 989.4e12 * GEMM, 66.9e12 * GEMM, 4.8e12 * MEM, 64e9
H200_NVLINK = 450e9


def _lora_linear(rows_in: int, rows_out: int, rank: int, device: str, dtype: torch.dtype) -> LoRALinear:
    linear = torch.nn.Linear(rows_in, rows_out, bias=False, device=device, dtype=dtype).requires_grad_(False)
    state = AdapterScale((), 1.0, 1.0, {})
    entry = state.entry_for("attention", (ModuleAlpha(1.0, rank),), torch.device(device))
    layer = LoRALinear(linear)
    layer.add_entry(LoRAFactors("a", entry, torch.zeros(rank, rows_in, device=device, dtype=dtype),
                                torch.zeros(rows_out, rank, device=device, dtype=dtype)))
    return layer


def test_a_lora_linear_counts_base_and_delta_flops_by_precision():
    rows, n_in, n_out, rank = 300, 64, 48, 8
    with fake_cuda() as mode:
        layer = _lora_linear(n_in, n_out, rank, "cuda", torch.bfloat16)
        with mode.counter.phase("denoise"), counting(mode.counter) as work, torch.no_grad():
            layer(torch.zeros(rows, n_in, device="cuda", dtype=torch.bfloat16))
    flops = work.by_phase()
    assert flops == {"denoise": {BASE: {"bfloat16": 2 * rows * n_in * n_out},
                                 LORA: {"bfloat16": 2 * rows * rank * (n_in + n_out)}}}


def test_replayed_layers_repeat_their_counted_flops():
    rows, width = 40, 32
    with fake_cuda() as mode:
        layers = torch.nn.ModuleList(torch.nn.Linear(width, width, device="cuda") for _ in range(3))
        undo = replay_repeats(list(layers), mode.counter)
        with mode.counter.phase("denoise"), counting(mode.counter) as work, torch.no_grad():
            x = torch.zeros(rows, width, device="cuda")
            for layer in layers:
                x = layer(x)
        undo()
    assert work.by_phase()["denoise"][BASE]["float32"] == 3 * 2 * rows * width * width


def _synthetic(flops, evaluations=2, lora_bytes=0):
    weights = {"transformer": 60 * 10**9, "text_encoder": 60 * 10**9, "vae": 10**9, "audio_vae": 10**8}
    rehearsal = Rehearsal(options=RehearsalOptions(), components=weights, host_components={}, lora_bytes=lora_bytes,
                          pristine_host_bytes=0, phases={"denoise": PhaseBytes(0, 1)}, device_peak=1, host_peak=1,
                          tokens={}, targets_bound=1, evaluations=evaluations, video_shape=(), audio_shape=(),
                          flops=flops, scheduler_shift=3.0)
    return Measured(rehearsal=rehearsal, weights=weights, fp8_transformer_bytes=30 * 10**9, largest_linear_bytes=1,
                    block_bytes=10**9, lora_bytes=lora_bytes)


FLOPS = {"denoise": {BASE: {"bfloat16": 2 * 10**15}, LORA: {"float32": 2 * 10**13}},
         "text_encoder": {BASE: {"bfloat16": 10**13}},
         "vae_decode": {BASE: {"float32": 10**14}}}


@pytest.mark.parametrize("offload", ["none", "auto", "group"])
def test_the_roofline_is_the_stated_arithmetic(offload):
    measured = _synthetic(FLOPS, evaluations=2, lora_bytes=10**9)
    out = roofline.predict(measured, Placement(offload), "unmerged", [BY_NAME["h200"]], steps=5)["h200"]
    step = max(10**15 / H200_BF16 + 10**13 / H200_FP32, (60 * 10**9 + 10**9) / H200_HBM)
    base = max(10**15 / H200_BF16, 60 * 10**9 / H200_HBM)
    if offload == "group":
        step, base = max(step, 60 * 10**9 / H200_HOST), max(base, 60 * 10**9 / H200_HOST)
    once = max(10**13 / H200_BF16, 60 * 10**9 / H200_HBM) + max(10**14 / H200_FP32, 10**9 / H200_HBM)
    moved = {"none": 0, "auto": 121.1 * 10**9, "group": 61.1 * 10**9}[offload]
    evaluations = roofline.request_evaluations(measured.rehearsal, 5)
    assert evaluations == 4  # 5 sigma points at shift 3: 4 evaluations
    video = evaluations * step + once + moved / H200_HOST
    assert out["step_s"] == pytest.approx(step, abs=1e-4)
    assert out["video_s"] == pytest.approx(video, abs=0.01)
    assert out["check_s"] == pytest.approx(3 * video + step, abs=0.02)
    assert out["usd_per_video"] == pytest.approx(video / 3600 * 5.00, abs=1e-4)
    assert out["lora_overhead"] == pytest.approx(step / base, abs=1e-4)


def test_flavors_without_peaks_or_enough_gpus_get_no_prediction_and_merged_no_check():
    measured = _synthetic(FLOPS)
    flavors = [BY_NAME["t4-small"], BY_NAME["h200"], BY_NAME["a100x4"]]
    assert set(roofline.predict(measured, Placement("none", ranks=4), None, flavors, steps=5)) == {"a100x4"}
    merged = roofline.predict(measured, Placement(), "merged", flavors, steps=5)
    assert merged["h200"]["check_s"] is None and merged["h200"]["step_s"] > 0
    unpriced = dataclasses.replace(BY_NAME["h200"], name="h200-unpriced", usd_per_hour=None)
    assert roofline.predict(measured, Placement(), "unmerged", [unpriced], steps=5)["h200-unpriced"]["usd_per_video"] is None


@pytest.mark.parametrize("ulysses, ring", [(4, 1), (1, 4), (2, 2)])
def test_context_parallel_pays_the_stated_exchange_over_the_gpus_link(ulysses, ring):
    """Ulysses: four all-to-alls of a rank's [rows/N, width] shard per block, (N−1)/N of it sent; ring: K and V
    shards passed N−1 times; over NVLink on SXM cards (A100: 300 GB/s a way), PCIe without it; not overlapped;
    added to every evaluation."""
    measured = _synthetic(FLOPS)
    measured.rehearsal.tokens = {"total": 40_000}
    ranks = ulysses * ring
    placement = Placement("none", ranks=ranks, ring=ring)
    shard = 40_000 / ranks * measured.attention_width * measured.element_bytes
    sent = (4 * shard * (ulysses - 1) / ulysses if ulysses > 1 else 0) + (2 * shard * (ring - 1) if ring > 1 else 0)
    peaks = roofline.PEAKS["A100"]
    assert roofline.exchange_seconds(measured, placement, peaks) == pytest.approx(measured.num_layers * sent / 300e9)
    pcie = roofline.PEAKS["RTX PRO 6000"]  # no NVLink: the ranks talk over PCIe 5
    assert roofline.exchange_seconds(measured, placement, pcie) == pytest.approx(measured.num_layers * sent / 64e9)
    split = roofline.predict_one(measured, placement, None, BY_NAME["a100x4"], steps=5)
    alone = roofline.predict_one(measured, Placement("none"), None, BY_NAME["a100x4"], steps=5)
    assert split["exchange_s"] > 0 and split["step_s"] == pytest.approx(
        roofline.step_seconds(measured, placement, peaks, None) + split["exchange_s"], abs=1e-4)
    assert split["decode_s"] == alone["decode_s"]  # one tile per clip: nothing to spread, no frames to gather


@pytest.mark.parametrize("ranks, share", [(1, 1.0), (4, 49 / 196), (8, 25 / 196)])
def test_the_video_decode_spreads_its_calls_over_the_ranks_and_receives_the_others_tiles(ranks, share):
    """1344×768, 124 frames: 7 clips × 28 tiles (256 px, ≥ 64 px overlap) = 196 decoder calls, call k on rank
    k mod N, so a rank runs ceil(196 / N); then it receives every tile it did not decode (28 frames × 256² × RGB,
    float32) over the link; the audio decode is not split."""
    from h3app.hardware.decode_split import DecodeCalls, clips, tiles_along

    assert tiles_along(1344, 256, 64) * tiles_along(768, 256, 64) == 28
    vae = type("VAE", (), {"tokens_chunk_size": 5, "config": type("C", (), {"token_drop": 3})})()
    assert clips(vae, 37) == 7  # 124 frames: 37 latent frames
    tile = 28 * 256 * 256 * 3 * 4
    measured = _synthetic(FLOPS)
    measured.rehearsal.decode = DecodeCalls(196, tile)
    peaks = roofline.PEAKS["H200"]
    placement = Placement("none", ranks=ranks)
    out = roofline.predict_one(measured, placement, None, BY_NAME["h200x8"], steps=5)
    decode = max(10**14 * share / H200_FP32, 10**9 / H200_HBM)  # FLOPs scaled by the share, the weights read whole
    received = (196 - 196 // ranks) * tile if ranks > 1 else 0
    assert out["decode_s"] == pytest.approx(decode + received / H200_NVLINK, abs=1e-3)
    assert roofline.once_seconds(measured, placement, peaks)["vae_decode"] == pytest.approx(decode, rel=1e-9)


@pytest.mark.parametrize("flavor, ranks, backend, share", [("h200", 1, "fa3", 648 / 989.4),
                                                           ("h200x4", 4, "cudnn", 595 / 989.4),
                                                           ("rtx-pro-6000", 1, "cudnn", 0.73),
                                                           ("a100-large", 1, "sdpa", 0.73)])
def test_the_attention_flops_run_at_the_share_of_the_backend_the_app_picks_on_the_card(flavor, ranks, backend,
                                                                                       share):
    """FA3 on Hopper with one rank, cuDNN under Ulysses (diffusers runs its FA3 on one rank only) and on
    Blackwell, SDPA elsewhere; each at its published share of the bf16 peak, the rest of the FLOPs at the GEMM
    rate; ``--attention sdpa`` prices a box without the package."""
    flops = {"denoise": {BASE: {"bfloat16": 3 * 10**15}}}
    measured = _synthetic(flops, evaluations=1)
    measured.rehearsal.attention = {"denoise": {BASE: {"bfloat16": 2 * 10**15}}}
    box = BY_NAME[flavor]
    peaks = roofline.PEAKS[box.gpu]
    out = roofline.predict_one(measured, Placement("none", ranks=ranks), None, box, steps=5)
    assert out["attention"] == backend
    bf16 = peaks.bf16 * 1e12
    step = max((10**15 / (bf16 * GEMM) + 2 * 10**15 / (bf16 * share)) / ranks, 60 * 10**9 / peaks.memory_bytes_per_s)
    assert out["step_s"] - out["exchange_s"] == pytest.approx(step, abs=2e-4)
    sdpa = roofline.predict_one(measured, Placement("none", ranks=ranks), None, box, steps=5, attention="sdpa")
    assert sdpa["attention"] == "sdpa" and sdpa["step_s"] >= out["step_s"]


def test_every_priced_flavor_reads_its_row():
    assert roofline.usd_per_hour(BY_NAME["a100-large"]) == 2.50
    assert roofline.usd_per_hour(BY_NAME["l40sx1"]) == 1.80
    assert roofline.usd_per_hour(BY_NAME["rtx-pro-6000"]) == 2.75
    assert roofline.usd_per_hour(BY_NAME["h200"]) == 5.00


# ------------------------------------------------------------------------------------- the tiny checkpoint
@pytest.fixture
def tiny_rank4(tiny_rank4_measured):
    """The session's tiny rank-4 rehearsal (tests/rehearsal_fixtures.py, shared with the bench's predictions)."""
    return tiny_rank4_measured


@pytest.mark.slow
def test_tiny_lora_flops_are_linear_in_rank_and_base_flops_do_not_move(tiny_rank4):
    rank8 = measure(tiny_lightx2v_options(8), repo.TINY)
    four, eight = tiny_rank4.rehearsal.flops["denoise"], rank8.rehearsal.flops["denoise"]
    assert four[BASE] == eight[BASE]
    assert set(four[LORA]) == {"bfloat16"}  # fake CUDA, bf16 base: the delta runs in bf16
    assert eight[LORA]["bfloat16"] == 2 * four[LORA]["bfloat16"] > 0


@pytest.mark.slow
def test_tiny_plan_fields_are_the_rehearsal_counts_through_the_stated_roofline(tiny_rank4, tiny_rank4_options):
    request = default_request(repo.TINY)
    plan = make_plan(request, Placement(), Setup(model=repo.TINY, adapter=tiny_rank4_options.adapter), hardware="h200",
                     measured=tiny_rank4, with_limits=False)
    data = plan.to_json()
    rehearsal = tiny_rank4.rehearsal
    per_eval = {p: n // rehearsal.evaluations for kind in (BASE, LORA)
                for p, n in rehearsal.flops["denoise"][kind].items()}
    assert data["flops_per_evaluation"] == sum(
        n // rehearsal.evaluations for kind in (BASE, LORA) for n in rehearsal.flops["denoise"][kind].values())
    assert set(data["predicted"]) == {"h200"}
    out = data["predicted"]["h200"]
    fused = {p: n // rehearsal.evaluations for kind in (BASE, LORA)
             for p, n in rehearsal.attention.get("denoise", {}).get(kind, {}).items()}
    assert fused.get("bfloat16", 0) > 0  # the fused attention's FLOPs are filed apart, and run at FA3's rate
    fa3 = 648e12  # the FlashAttention-3 paper's H100 SXM figure (docs/hardware.md)
    compute = sum((n - fused.get(p, 0)) / (H200_BF16 if p == "bfloat16" else H200_FP32) + fused.get(p, 0) / fa3
                  for p, n in per_eval.items())
    reads = tiny_rank4.weights["transformer"] + tiny_rank4.lora_bytes
    moved = sum(rehearsal.moved["denoise"].values()) // rehearsal.evaluations
    assert moved > 0  # norms, activations, residual adds: memory-bound bytes are counted
    ops = sum(rehearsal.ops["denoise"].values()) // rehearsal.evaluations
    assert ops > 0  # and every op that does work, one launch each
    assert out["step_s"] == pytest.approx(max(compute, reads / H200_HBM) + moved / H200_HBM
                                          + ops * roofline.LAUNCH_OVERHEAD_S, abs=1e-4)
    assert set(out) == {"step_s", "exchange_s", "evaluations", "skipped", "skipped_step_s", "text_encoder_s",
                        "encode_s", "decode_s", "transfer_s", "video_s", "check_s", "usd_per_video", "lora_overhead",
                        "attention"}
    assert out["attention"] == "fa3"  # Hopper, one rank: the backend the app picks there
    assert out["exchange_s"] == 0  # one rank exchanges nothing
    assert out["video_s"] >= out["step_s"] and out["check_s"] >= 3 * out["video_s"] - 0.01
    assert "fastest placement per flavor (spec-sheet prediction, not measured)" in describe_plan(plan)
    assert "h200: --offload none: step" in describe_plan(plan)
    assert f"{plan.dtype} (video decoder {plan.vae_dtype})," in describe_plan(plan)  # the decoder planned, named


@pytest.mark.slow
def test_the_fp32_delta_costs_more_than_the_bf16_one_on_the_same_plan(monkeypatch, tiny_rank4):
    import h3app.lora.entries as entries_module

    monkeypatch.setattr(entries_module, "delta_dtype", lambda device, base: torch.float32)
    before = measure(tiny_lightx2v_options(4), repo.TINY)
    assert set(before.rehearsal.flops["denoise"][LORA]) == {"float32"}
    # the arithmetic alone: on the tiny model the per-op term sets the step, and the two paths launch different ops
    roof = dataclasses.replace(roofline.PEAKS["H200"], op_overhead_s=0.0)
    lora_fp32 = roofline.predict_one(before, Placement(), "unmerged", BY_NAME["h200"], 5, peaks=roof)["lora_overhead"]
    lora_bf16 = roofline.predict_one(tiny_rank4, Placement(), "unmerged", BY_NAME["h200"], 5, peaks=roof)["lora_overhead"]
    assert lora_fp32 >= lora_bf16 >= 1.0


def test_the_apps_time_model_prices_the_backend_this_box_runs(monkeypatch):
    """On a GPU box the page's estimate counts the attention backend the loader picks here (what is installed),
    where ``plan`` assumes the card's pick is installed."""
    from types import SimpleNamespace

    from h3app.hardware import estimate, preflight
    from h3app.model import attention
    from h3app.rules.attention import SDPA

    asked = []
    monkeypatch.setattr(preflight, "this_box", lambda *a, **k: BY_NAME["h200"])
    monkeypatch.setattr(attention, "chosen", lambda device, dtype, want, split: asked.append((want, split)) or SDPA)
    options = SimpleNamespace(device="cuda", dtype=torch.bfloat16, offload="none", fp8=False, fp8_text_encoder=False,
                              fuse_qkv=False, vae_dtype=torch.float32, attention="auto", split="")
    model = estimate.for_app("full", options)
    assert model.setup.attention == "sdpa" and asked == [("auto", "")]
