"""How long a request takes on each flavor, before renting it: the rehearsal's counted work against spec-sheet peaks.

A roofline plus a per-op cost: each phase takes ``max(Σ GEMM FLOPs_p / (peak_p × GEMM_EFFICIENCY) + Σ attention
FLOPs_p / attention rate, weight bytes / bandwidth) + moved bytes / bandwidth + ops × Peaks.op_overhead_s``, with
``bandwidth`` = the spec sheet's × MEMORY_EFFICIENCY. The FLOPs per precision ``p`` of the compute-bound ops
(matmuls, convolutions) are counted on the fake-CUDA rehearsal (``work.py``) in the precision the GPU runs each in
(bf16, fp32 on CUDA cores, TF32 for fp32 convolutions: cuDNN's default); the fused attention ops' FLOPs are filed
apart and run at the share of the bf16 peak the attention backend reaches on the card (``attention_speed.py``:
the backend the app picks there, ``rules.attention.choose``); the weights are read once; the memory-bound ops
(norms, activations, casts, residual adds, tile blending: ``work.bytes_moved``) run one after the other as eager
PyTorch runs them. Peaks are dense, no sparsity (vendor datasheets named in docs/hardware.md); the two
efficiencies are published measurements, not fits (docs/hardware.md: the calibration). ``ops`` are the ops that did
work in the phase (one kernel launch each, ``work.py``), each at a fixed cost: on a GPU the launch overhead of eager
PyTorch (:data:`LAUNCH_OVERHEAD_S`), on a CPU the per-op cost measured at start-up (``estimate.cpu_peaks``, whose
measured rates take no efficiency). Offload adds host-link transfers: ``auto`` moves every component to the GPU
once per request, ``group`` streams the transformer once per evaluation beside the compute (a step takes at least
that transfer). The weights are read in full on every GPU.

Context parallel divides an evaluation's FLOPs and moved bytes by its ranks and adds the ranks' exchange of
activations (``exchange_seconds``: over NVLink where the card has it, else PCIe; not overlapped). The video decode
divides its decoder calls (clips × tiles) over the ranks and each receives the others' tiles (``decode_split.py``).

Per flavor (``predict_one``), nothing hidden: ``video_s = (evaluations − skipped) × step_s + skipped ×
skipped_step_s + text_encoder_s + encode_s + decode_s + transfer_s`` — ``step_s`` one transformer evaluation,
``skipped`` the evaluations the step cache skips (``--cache fbc``: the measured share, ``model/denoise_cache.py``;
a skipped evaluation runs the first of ``num_layers`` main blocks), ``decode_s`` the video and audio decodes,
``encode_s`` keyframe and reference encodes, ``transfer_s`` offload's moves; ``check_s`` (the equivalence check:
its full generations plus the control step; unmerged LoRA only), ``usd_per_video`` (``video_s`` at the flavor's
hourly price), ``lora_overhead`` (``step_s`` over the same step without the LoRA delta's FLOPs and factor reads)
and ``attention`` (the backend counted). These are predictions: ``bench/gpu.py`` prints them beside what a GPU
measures; docs/hardware.md's calibration table sets them beside published runs (``bench/calibration.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..model import repo
from ..rules.attention import AUTO, BLACKWELL, HOPPER, SDPA, AttentionBackend
from ..rules.choices import NO_CACHE, UNMERGED
from .attention_speed import ADA, AMPERE, HALF, planned_backend, share_of_peak
from .decode_split import gather_bytes, rank_share
from .flavors import Flavor
from .work import BASE, LORA, TF32, moved_total, total

LAUNCH_OVERHEAD_S = 5e-6  # one eager kernel launch on an NVIDIA GPU: 4–6 µs measured, "a few µs" (docs/hardware.md)
GEMM_EFFICIENCY = 716 / 989.4  # cuBLAS's bf16 GEMM at 4096³ on an H100 SXM: 716 of 989.4 TFLOPS (docs/hardware.md)
MEMORY_EFFICIENCY = 0.9  # a streaming copy's sustained bandwidth on an H100 SXM: ~3.0 of 3.35 TB/s (docs/hardware.md)
PHASES = ("text_encoder", "vae_encode", "audio_vae_encode", "vae_decode", "audio_vae_decode")  # once per request
ENCODES, DECODES = ("vae_encode", "audio_vae_encode"), ("vae_decode", "audio_vae_decode")
VIDEO_DECODE = "vae_decode"  # the phase whose tiles a multi-rank run spreads over its ranks
DENOISE = "denoise"


@dataclass(frozen=True)
class Peaks:
    """Spec-sheet peaks of one GPU: dense TFLOPS per precision, memory bandwidth (TB/s) and host link (GB/s, one
    direction). ``fp8`` is None where the card has no fp8 tensor cores. ``op_overhead_s``: the fixed seconds each
    op costs beside its FLOPs and bytes (a GPU's kernel launch; a CPU's per-op cost, measured). ``arch``: the GPU
    architecture (``rules.attention`` names; None: a CPU); ``link_gbps``: GPU-to-GPU NVLink, GB/s one direction
    (None: the GPUs talk over the host link). The efficiencies: the share of the peaks real GEMMs and streaming ops
    reach (1 for rates measured on this machine)."""

    gpu: str
    bf16: float
    fp8: float | None
    tf32: float
    fp32: float
    memory_tbps: float
    host_gbps: float
    op_overhead_s: float = LAUNCH_OVERHEAD_S
    arch: str | None = None
    link_gbps: float | None = None
    gemm_efficiency: float = GEMM_EFFICIENCY
    memory_efficiency: float = MEMORY_EFFICIENCY

    def flops_per_s(self, precision: str) -> float:
        """Peak FLOP/s of ``precision`` (a ``work.precision`` name)."""
        tflops = {"bfloat16": self.bf16, "float16": self.bf16, TF32: self.tf32, "float32": self.fp32,
                  "float64": self.fp32 / 2}.get(precision)
        if tflops is None and precision.startswith("float8"):
            tflops = self.fp8 or self.bf16
        return (tflops if tflops is not None else self.fp32) * 1e12

    def gemm_flops_per_s(self, precision: str) -> float:
        """FLOP/s a real GEMM or convolution of ``precision`` reaches."""
        return self.flops_per_s(precision) * self.gemm_efficiency

    def attention_flops_per_s(self, precision: str, backend: AttentionBackend) -> float:
        """FLOP/s of fused attention of ``precision`` by ``backend``: its published share of the bf16 peak for
        half precision on a known architecture (``attention_speed``), else a GEMM's rate (fp32: CUDA cores)."""
        share = share_of_peak(backend, self.arch) if precision in HALF else None
        return self.flops_per_s(precision) * share if share is not None else self.gemm_flops_per_s(precision)

    @property
    def memory_bytes_per_s(self) -> float:
        """Bytes/s streaming ops sustain (the spec sheet's × ``memory_efficiency``)."""
        return self.memory_tbps * 1e12 * self.memory_efficiency

    @property
    def link_bytes_per_s(self) -> float:
        """Bytes/s one GPU sends another: NVLink where the card has it, else the host link."""
        return (self.link_gbps or self.host_gbps) * 1e9

    @property
    def host_bytes_per_s(self) -> float:
        return self.host_gbps * 1e9


PCIE4, PCIE5 = 32.0, 64.0  # GB/s one direction of an x16 link
NVLINK3, NVLINK4 = 300.0, 450.0  # GB/s one direction per GPU: A100 SXM 600 GB/s, H100/H200 SXM 900 GB/s in total
# Keyed by ``Flavor.gpu``. RTX PRO 6000: FP32 and bandwidth from its datasheet; the tensor rates are its 4 PFLOPS
# (FP4, sparse) halved per precision step. The SXM datasheets' rows carry NVLink; L40S and RTX PRO 6000 have none.
PEAKS: dict[str, Peaks] = {peaks.gpu: peaks for peaks in (
    Peaks("A100", bf16=312, fp8=None, tf32=156, fp32=19.5, memory_tbps=2.039, host_gbps=PCIE4, arch=AMPERE,
          link_gbps=NVLINK3),
    Peaks("L40S", bf16=362.05, fp8=733, tf32=183, fp32=91.6, memory_tbps=0.864, host_gbps=PCIE4, arch=ADA),
    Peaks("RTX PRO 6000", bf16=500, fp8=1000, tf32=250, fp32=125, memory_tbps=1.792, host_gbps=PCIE5, arch=BLACKWELL),
    Peaks("H100", bf16=989.4, fp8=1978.9, tf32=494.7, fp32=66.9, memory_tbps=3.35, host_gbps=PCIE5, arch=HOPPER,
          link_gbps=NVLINK4),
    Peaks("H200", bf16=989.4, fp8=1978.9, tf32=494.7, fp32=66.9, memory_tbps=4.8, host_gbps=PCIE5, arch=HOPPER,
          link_gbps=NVLINK4),
)}


def usd_per_hour(hardware: Flavor) -> float | None:
    """The flavor's published price per box-hour (None where none is published)."""
    return hardware.usd_per_hour


def phase_seconds(flops: dict[str, int], bytes_read: int, peaks: Peaks, ranks: int = 1, moved: int = 0,
                  ops: int = 0, attention: dict[str, int] | None = None, backend: AttentionBackend | None = None,
                  share: float = 1.0) -> float:
    """Seconds of one phase: GEMM FLOPs by precision at ``peaks.gemm_flops_per_s`` and ``attention`` (the fused
    attention ops' share of ``flops``, by precision) at ``backend``'s rate, split over ``ranks``, against reading
    ``bytes_read``; then the memory-bound ops' ``moved`` bytes (split over ``ranks``); then ``ops`` ×
    ``peaks.op_overhead_s`` (every rank launches every op: not split). ``share``: the part of the phase this rank
    runs (a decode's tiles spread over ranks): FLOPs, moved bytes and ops scaled by it, the weights read whole."""
    ranks = max(1, ranks)
    backend = backend or planned_backend(peaks.arch)
    attention = attention or {}
    compute = 0.0
    for precision, count in flops.items():
        fused = min(count, attention.get(precision, 0))
        compute += (count - fused) / peaks.gemm_flops_per_s(precision)
        compute += fused / peaks.attention_flops_per_s(precision, backend) if fused else 0.0
    compute *= share / ranks
    memory_bound = moved * share / ranks / peaks.memory_bytes_per_s
    return max(compute, bytes_read / peaks.memory_bytes_per_s) + memory_bound + ops * share * peaks.op_overhead_s


def flops_per_evaluation(rehearsal: Any, kinds: tuple[str, ...] = (BASE, LORA)) -> dict[str, int]:
    """One transformer evaluation's FLOPs by precision (the rehearsal's denoising FLOPs over its evaluations)."""
    evaluations = max(1, rehearsal.evaluations)
    return {prec: count // evaluations for prec, count in total(rehearsal.flops, DENOISE, kinds).items()}


def request_evaluations(rehearsal: Any, steps: int) -> int:
    """Transformer evaluations of a request of ``steps`` sigma points at the pipeline's shift."""
    from ..backend.generation import count_evaluations

    return count_evaluations(steps, rehearsal.scheduler_shift)


def peaks_for_device(name: str) -> Peaks | None:
    """The peaks of a GPU seen at run time (``torch.cuda.get_device_properties(...).name``), None if unknown."""
    squashed = name.upper().replace(" ", "")
    for key, peaks in PEAKS.items():
        if key.upper().replace(" ", "") in squashed:
            return peaks
    return None


def backend_for(measured: Any, placement: Any, peaks: Peaks, attention: str = AUTO) -> AttentionBackend:
    """The attention backend the transformer of ``measured`` runs with ``placement`` on ``peaks``' card
    (``attention_speed.planned_backend``: ``attention`` as asked, ``auto`` the app's pick there)."""
    return planned_backend(peaks.arch, attention, measured.element_bytes == 2, placement.ranks, placement.ring)


def step_seconds(measured: Any, placement: Any, peaks: Peaks, lora: str | None,
                 backend: AttentionBackend | None = None) -> float:
    """One evaluation on ``peaks``: the counted FLOPs (without the delta's unless ``lora`` is ``unmerged``; the
    attention at ``backend``'s rate, default the card's planned one) against the transformer's weight reads (fp8
    bytes with ``placement.fp8``) plus the factors' when unmerged; with ``group`` offload at least the
    transformer's transfer over the host link."""
    partition = repo.partition_for(measured.rehearsal.options.workflow)
    transformer = measured.fp8_transformer_bytes if placement.fp8 else measured.weights.get(partition, 0)
    unmerged = lora == UNMERGED
    kinds = (BASE, LORA) if unmerged else (BASE,)
    flops = flops_per_evaluation(measured.rehearsal, kinds)
    evaluations = max(1, measured.rehearsal.evaluations)
    attention = {prec: count // evaluations for prec, count in
                 total(measured.rehearsal.attention, DENOISE, kinds).items()}
    moved = moved_total(measured.rehearsal.moved, DENOISE, kinds) // evaluations
    ops = moved_total(measured.rehearsal.ops, DENOISE, kinds) // evaluations
    step = phase_seconds(flops, transformer + (measured.lora_bytes if unmerged else 0), peaks, placement.ranks,
                         moved, ops, attention, backend or backend_for(measured, placement, peaks))
    if placement.offload == "group":  # the transformer streams in once per evaluation, beside the compute
        step = max(step, transformer / peaks.host_bytes_per_s)
    return step


def step_terms(measured: Any, placement: Any, peaks: Peaks, backend: AttentionBackend | None = None
               ) -> dict[str, float]:
    """The terms of one evaluation without LoRA (:func:`step_seconds` plus the exchange), each alone, in seconds:
    ``gemm_s`` (matmuls at ``gemm_efficiency``), ``attention_s`` (at ``backend``'s rate), ``memory_bound_s`` (the
    eager memory-bound ops' bytes), ``launches_s`` (ops × the per-op cost), ``exchange_s``; ``weights_s`` is the
    weight read the compute hides (it counts only when larger). For the docs' account of where a step goes."""
    backend = backend or backend_for(measured, placement, peaks)
    rehearsal, ranks = measured.rehearsal, max(1, placement.ranks)
    evaluations = max(1, rehearsal.evaluations)
    flops = flops_per_evaluation(rehearsal, (BASE,))
    fused = {p: n // evaluations for p, n in total(rehearsal.attention, DENOISE, (BASE,)).items()}
    partition = repo.partition_for(rehearsal.options.workflow)
    transformer = measured.fp8_transformer_bytes if placement.fp8 else measured.weights.get(partition, 0)
    return {"gemm_s": sum((n - fused.get(p, 0)) / peaks.gemm_flops_per_s(p) for p, n in flops.items()) / ranks,
            "attention_s": sum(n / peaks.attention_flops_per_s(p, backend) for p, n in fused.items()) / ranks,
            "memory_bound_s": moved_total(rehearsal.moved, DENOISE, (BASE,)) // evaluations / ranks
            / peaks.memory_bytes_per_s,
            "launches_s": moved_total(rehearsal.ops, DENOISE, (BASE,)) // evaluations * peaks.op_overhead_s,
            "exchange_s": exchange_seconds(measured, placement, peaks),
            "weights_s": transformer / peaks.memory_bytes_per_s}


def exchange_seconds(measured: Any, placement: Any, peaks: Peaks) -> float:
    """Context parallel's communication in one evaluation, per rank, not overlapped with compute, over the GPUs'
    link (``Peaks.link_bytes_per_s``: NVLink on the SXM cards, PCIe on the L40S and RTX PRO 6000). Ulysses (N
    ranks): every main block swaps q, k, v before attention and the output after it, four all-to-alls in which a
    rank sends (N−1)/N of its [rows/N, attention width] shard. Ring: K and V shards pass N−1 times round the ring.
    Rows: the rehearsal's packed rows; elements in the compute dtype."""
    ranks = max(1, placement.ranks)
    if ranks == 1:
        return 0.0
    ring = max(1, placement.ring)
    ulysses = ranks // ring
    shard = measured.rehearsal.tokens.get("total", 0) / ranks * measured.attention_width * measured.element_bytes
    sent = 0.0
    if ulysses > 1:
        sent += 4 * shard * (ulysses - 1) / ulysses
    if ring > 1:
        sent += 2 * shard * (ring - 1)
    return measured.num_layers * sent / peaks.link_bytes_per_s


def skipped_evaluations(evaluations: int, cache: str) -> int:
    """Evaluations of a run the step cache ``cache`` skips: the measured share (never the first, which has nothing
    to reuse); 0 without a cache."""
    if cache == NO_CACHE:
        return 0
    from ..model.denoise_cache import MEASURED_SKIP_SHARE

    return min(max(0, evaluations - 1), round(MEASURED_SKIP_SHARE * evaluations))


def skipped_step_seconds(step: float, measured: Any) -> float:
    """An evaluation the first-block cache skips: the leader of ``measured.num_layers`` main blocks runs, the others'
    residual is reused (embeddings, token refiner and heads, a small share at full size, are left out)."""
    return step / max(1, measured.num_layers)


def predict_one(measured: Any, placement: Any, lora_mode: str | None, hardware: Flavor,
                steps: int, cache: str = NO_CACHE, peaks: Peaks | None = None,
                attention: str = AUTO) -> dict[str, Any] | None:
    """The prediction of a request of ``steps`` with ``placement`` on ``hardware`` (the module docstring's sum,
    each term a field); None where its GPU has no spec-sheet peaks or too few GPUs for the ranks. ``peaks``: rates
    measured on this machine instead of a spec sheet (``estimate.cpu_peaks``); ``attention``: the ``--attention``
    value (``auto``: the backend the app picks on the card, its package assumed installed)."""
    from ..backend.equivalence import CONTROL_STEPS, FULL_RUNS

    peaks = peaks or PEAKS.get(hardware.gpu) or peaks_for_device(hardware.gpu)  # a flavor's GPU, or one seen at run time
    if peaks is None or placement.ranks > hardware.gpus:
        return None
    backend = backend_for(measured, placement, peaks, attention)
    rehearsal = measured.rehearsal
    partition = repo.partition_for(rehearsal.options.workflow)
    exchange = exchange_seconds(measured, placement, peaks)
    step = step_seconds(measured, placement, peaks, lora_mode, backend) + exchange
    base = step_seconds(measured, placement, peaks, None, backend) + exchange
    once = once_seconds(measured, placement, peaks)
    moved = sum(measured.weights.values()) if placement.offload == "auto" else \
        sum(size for name, size in measured.weights.items() if name != partition) if placement.offload == "group" else 0
    evaluations = request_evaluations(rehearsal, steps)
    skipped = skipped_evaluations(evaluations, cache)
    skipped_step = skipped_step_seconds(step, measured)
    gather = gather_bytes(rehearsal.decode, placement.ranks) / peaks.link_bytes_per_s
    parts = {"text_encoder_s": once.get("text_encoder", 0.0), "encode_s": sum(once.get(n, 0.0) for n in ENCODES),
             "decode_s": sum(once.get(n, 0.0) for n in DECODES) + gather,
             "transfer_s": moved / peaks.host_bytes_per_s}
    video = (evaluations - skipped) * step + skipped * skipped_step + sum(parts.values())
    price = usd_per_hour(hardware)
    return {"step_s": round(step, 4), "exchange_s": round(exchange, 4), "evaluations": evaluations,
            "skipped": skipped, "skipped_step_s": round(skipped_step, 4),
            **{name: round(value, 3) for name, value in parts.items()}, "video_s": round(video, 2),
            "check_s": round(len(FULL_RUNS) * video + CONTROL_STEPS * step, 2) if lora_mode == UNMERGED else None,
            "usd_per_video": round(video / 3600 * price, 4) if price is not None else None,
            "lora_overhead": round(step / base, 4) if base > 0 else None, "attention": backend.name}


def once_seconds(measured: Any, placement: Any, peaks: Peaks) -> dict[str, float]:
    """Seconds of each once-per-request phase (:data:`PHASES`) that the rehearsal ran (their attention is SDPA's:
    the backend is set on the transformer alone); the video decode at this rank's share of its tiles
    (``decode_split.rank_share``), the gather not included."""
    from .rehearsal import PHASE_COMPONENT

    rehearsal = measured.rehearsal
    share = rank_share(rehearsal.decode.calls, placement.ranks)
    return {name: phase_seconds(total(rehearsal.flops, name), measured.weights.get(PHASE_COMPONENT.get(name, name), 0),
                                peaks, moved=moved_total(rehearsal.moved, name), ops=moved_total(rehearsal.ops, name),
                                attention=total(rehearsal.attention, name), backend=SDPA,
                                share=share if name == VIDEO_DECODE else 1.0)
            for name in PHASES if name in rehearsal.flops or name in rehearsal.moved or name in rehearsal.ops}


def predict(measured: Any, placement: Any, lora_mode: str | None, flavors: Iterable[Flavor],
            steps: int, cache: str = NO_CACHE, attention: str = AUTO) -> dict[str, dict[str, Any]]:
    """:func:`predict_one` for every flavor of ``flavors`` that has spec-sheet peaks and GPUs for the ranks."""
    out = {}
    for hardware in flavors:
        one = predict_one(measured, placement, lora_mode, hardware, steps, cache, attention=attention)
        if one is not None:
            out[hardware.name] = one
    return out


PREVIEW_HOST_SECONDS = 0.01  # a preview's host side: copy three small frames and a waveform, compose the strip (~3 ms
                             # measured on a 2-core CPU at 544p), write its PNG (~5 ms); a GPU sync it waits for anyway


def preview_seconds(measured: Any, peaks: Peaks) -> float | None:
    """One step preview (``backend.preview``) on ``peaks``: the FLOPs the full-size rehearsal counted under its
    ``preview`` phase, per evaluation, against the bytes it read (``Rehearsal.preview_read_bytes``: the packed
    rows, their velocities, the audio VAE's weights), plus :data:`PREVIEW_HOST_SECONDS`. None when the rehearsal
    ran no preview (``RehearsalOptions(preview=True)``). Its share of a step is ``preview_seconds / step_seconds``:
    the issue's budget is 5 % (docs/performance.md)."""
    from .rehearsal import PREVIEW

    rehearsal = measured.rehearsal
    if not rehearsal.preview_read_bytes:
        return None
    evaluations = max(1, rehearsal.evaluations)
    flops = {prec: count // evaluations for prec, count in total(rehearsal.flops, PREVIEW).items()}
    ops = moved_total(rehearsal.ops, PREVIEW) // evaluations
    return phase_seconds(flops, rehearsal.preview_read_bytes, peaks, ops=ops) + PREVIEW_HOST_SECONDS
