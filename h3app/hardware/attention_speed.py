"""How fast each attention backend runs H3's attention on each GPU architecture: the share of the card's dense bf16
tensor peak a fused attention kernel reaches, from published kernel benchmarks (docs/hardware.md names them).

H3's attention is long and wide (37,777 rows × 56 heads of 128 at 1344×768, 124 frames; non-causal; bf16): the
regime where the published forward-pass benchmarks sit at their plateau, so one share per (backend, architecture):

- Hopper (H100/H200), the FlashAttention-3 paper's H100 SXM5 forward benchmark, head dim 128, non-causal, 16k
  rows: FlashAttention-3 648, cuDNN 595, FlashAttention-2 370 TFLOPS of 989.4. PyTorch's SDPA runs its
  FlashAttention-2 kernel there (flash backend for bf16), so SDPA = FA2.
- Ampere, Ada and workstation Blackwell (sm80/sm89/sm120: no Hopper warpgroup MMA, so attention kernels are the
  FlashAttention-2 design): the FlashAttention-2 paper's forward pass on A100, up to 73 % of peak. No published
  figure was found for cuDNN on these, nor for any kernel on sm120: they take the same share (an assumption).
- Sage (8-bit, approximate) is never planned (``rules.attention.choose`` never picks it); asked for, it is counted
  at FlashAttention-2's share (no figure used: an upper bound of its time).

The backend is set on the transformer alone (``model/attention.apply``): the denoising steps run it; every other
phase (the video decoder's attention) runs SDPA. Attention in float32 (the video decoder with ``--vae-dtype
float32``) runs SDPA's memory-efficient kernel on the CUDA cores: counted as a GEMM at the fp32 rate.
"""

from __future__ import annotations

from ..rules.attention import (
    AUTO,
    BLACKWELL,
    CUDNN,
    FA2,
    FA3,
    HOPPER,
    RING,
    SAGE,
    SDPA,
    ULYSSES,
    AttentionBackend,
    arch_of,
    choose,
)

AMPERE, ADA = arch_of((8, 0)), arch_of((8, 9))  # A100; L40S
H100_BF16_TFLOPS = 989.4  # the denominator of the FlashAttention-3 paper's H100 SXM5 figures
FA2_ON_AMPERE = 0.73  # FlashAttention-2 paper: forward pass up to 73 % of A100's peak
# (backend name, architecture) → share of the dense bf16 tensor peak its forward attention reaches.
SHARE_OF_PEAK: dict[tuple[str, str], float] = {
    (FA3.name, HOPPER): 648 / H100_BF16_TFLOPS,
    (CUDNN.name, HOPPER): 595 / H100_BF16_TFLOPS,
    (FA2.name, HOPPER): 370 / H100_BF16_TFLOPS,
    (SDPA.name, HOPPER): 370 / H100_BF16_TFLOPS,  # PyTorch's flash backend is FlashAttention-2's kernel
    (SAGE.name, HOPPER): 370 / H100_BF16_TFLOPS,
    **{(backend.name, arch): FA2_ON_AMPERE for arch in (AMPERE, ADA, BLACKWELL)
       for backend in (SDPA, FA2, CUDNN, SAGE)},
}
HALF = ("bfloat16", "float16")  # what the fused tensor-core kernels take


def every_module() -> frozenset[str]:
    """Every backend's module, as if installed: the plan assumes the backend the app would pick on the card."""
    from ..rules.attention import ATTENTION_BACKENDS

    return frozenset(b.module for b in ATTENTION_BACKENDS if b.module)


def planned_backend(arch: str | None, asked: str = AUTO, half: bool = True, ranks: int = 1,
                    ring: int = 1) -> AttentionBackend:
    """The backend a plan counts for the transformer on a card of ``arch``: ``asked``, or (``auto``) the one the
    app picks there (``rules.attention.choose``) with every package installed, for a transformer computing in
    half precision (``half``) over ``ranks`` context-parallel ranks, ``ring`` of them by ring attention."""
    split = RING if ring > 1 else ULYSSES if ranks > 1 else ""
    return choose(arch, every_module(), asked, half=half, split=split)


def share_of_peak(backend: AttentionBackend, arch: str | None) -> float | None:
    """The share of the bf16 tensor peak ``backend`` reaches on ``arch``; None where nothing is known (a CPU, or a
    backend that does not run on the architecture: it is refused at start-up, so SDPA's share is used)."""
    if arch is None:
        return None
    return SHARE_OF_PEAK.get((backend.name, arch), SHARE_OF_PEAK.get((SDPA.name, arch)))
