"""Attention backends: the app's names for diffusers' attention dispatcher backends, one entry per backend.

The app runs H3's attention through diffusers' dispatcher (``set_attention_backend`` / ``attention_backend``). Each
entry names the dispatcher's backend (``diffusers.models.attention_dispatch.AttentionBackendName`` values), the
Python module it needs and the package that provides it, whether its output is exact (the same math as SDPA up to
float rounding, so the equivalence check's bitwise pair stays meaningful), whether diffusers 0.42.1 runs it under
context parallel, whether it needs bf16/fp16 inputs, and the GPU architectures it is picked on. Torch-free: the
CLI's flag parser, the plan and the start-up line read it without loading torch (docs/performance.md, "Attention").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import overload

HOPPER, BLACKWELL = "hopper", "blackwell"  # sm90 (H100, H200); sm100/sm120 (B200, B300, RTX PRO 6000)
ULYSSES, RING = "ulysses", "ring"  # how ranks split the sequence (``--ulysses`` / ``--ring``); "" for one rank


@dataclass(frozen=True)
class AttentionBackend:
    """One attention backend. ``name``: the app's spelling (``--attention``); ``dispatcher``: diffusers'
    ``AttentionBackendName`` value; ``module``: the import that must succeed for it to run (None: in torch);
    ``package``: what to install for ``module``; ``exact``: same math as SDPA (False: quantised, e.g. Sage);
    ``first_on``: architectures it is picked on, in order of preference; ``context_parallel``: diffusers 0.42.1
    registers it as running under ``enable_parallelism``; ``half_only``: needs bf16/fp16 query, key and value;
    ``cuda_only``: runs on CUDA GPUs only."""

    name: str
    dispatcher: str
    module: str | None
    exact: bool
    first_on: tuple[str, ...] = ()
    label: str = ""
    package: str = ""
    context_parallel: bool = True
    half_only: bool = True
    cuda_only: bool = True


SDPA = AttentionBackend("sdpa", "native", None, True, (), "PyTorch SDPA", half_only=False, cuda_only=False)
# diffusers 0.42.1 registers its local FA3 without context-parallel support (only the Hub kernel has it, and the
# app downloads no kernels at run time): with --ulysses the auto choice on Hopper is cuDNN.
FA3 = AttentionBackend("fa3", "_flash_3", "flash_attn_interface", True, (HOPPER,), "FlashAttention 3",
                       "FlashAttention 3 (flash_attn_interface: build flash-attention's hopper/ folder)",
                       context_parallel=False)
FA2 = AttentionBackend("flash", "flash", "flash_attn", True, (), "FlashAttention 2", "flash-attn")
CUDNN = AttentionBackend("cudnn", "_native_cudnn", None, True, (HOPPER, BLACKWELL), "cuDNN attention")
SAGE = AttentionBackend("sage", "sage", "sageattention", False, (), "SageAttention (8-bit)",
                        "sageattention")

ATTENTION_BACKENDS: tuple[AttentionBackend, ...] = (SDPA, FA3, FA2, CUDNN, SAGE)
BY_NAME = {b.name: b for b in ATTENTION_BACKENDS}
AUTO = "auto"  # --attention auto (the default): the fastest exact backend installed for the card
ATTENTION_CHOICES = (AUTO, *BY_NAME)


@overload
def arch_of(capability: tuple[int, int]) -> str: ...
@overload
def arch_of(capability: None) -> None: ...
@overload
def arch_of(capability: tuple[int, int] | None) -> str | None: ...
def arch_of(capability: tuple[int, int] | None) -> str | None:
    """A CUDA compute capability ``(major, minor)`` → :data:`HOPPER` (9.x), :data:`BLACKWELL` (10.x, 12.x), or
    ``"sm<major><minor>"`` for any other GPU; None (no GPU) → None."""
    if capability is None:
        return None
    major, minor = capability
    if major == 9:
        return HOPPER
    if major in (10, 12):
        return BLACKWELL
    return f"sm{major}{minor}"


def choose(arch: str | None, installed: frozenset[str] | set[str], asked: str = AUTO, *, half: bool = True,
           split: str = "") -> AttentionBackend:
    """The backend a run uses. ``arch``: the GPU's architecture (:func:`arch_of`; None for a CPU); ``installed``:
    the importable modules among the entries' ``module`` values; ``asked``: the ``--attention`` value; ``half``:
    the transformer computes in bf16/fp16; ``split``: :data:`ULYSSES`, :data:`RING` or "" (one rank).

    ``auto`` picks, in order, the exact backends for the architecture whose module is installed and that can run
    this placement (bf16/fp16 inputs, diffusers' context parallel), else SDPA; on a CPU always SDPA (nothing
    changes there). Ring attention merges partial results by their log-sum-exp, which h3app takes from cuDNN: with
    ``--ring`` auto is cuDNN. A named backend is returned as asked; :func:`refusal` says whether it can run."""
    if asked != AUTO:
        return BY_NAME[asked]
    if arch is None:
        return SDPA
    if split == RING:
        return CUDNN
    for backend in ATTENTION_BACKENDS:
        if arch in backend.first_on and _fits(backend, installed, half, split):
            return backend
    return SDPA


def _fits(backend: AttentionBackend, installed: frozenset[str] | set[str], half: bool, split: str) -> bool:
    return (backend.exact and (backend.module is None or backend.module in installed)
            and (half or not backend.half_only) and (not split or backend.context_parallel))


def refusal(backend: AttentionBackend, arch: str | None, installed: frozenset[str] | set[str], *, half: bool = True,
            split: str = "") -> str | None:
    """Why ``--attention NAME`` cannot run here (one line that names the fix), or None when it can."""
    flag = f"--attention {backend.name}"
    if backend.cuda_only and arch is None:
        return f"{flag} runs on CUDA GPUs only: on the CPU use --attention auto (PyTorch SDPA)."
    if backend.module is not None and backend.module not in installed:
        return f"{flag} needs {backend.label}, which is not installed: install {backend.package}, or use " \
               f"--attention auto."
    if backend.half_only and not half:
        return f"{flag} needs bfloat16 inputs: add --dtype bfloat16, or use --attention auto (SDPA in float32)."
    if split == RING and backend is not CUDNN:
        return f"{flag} cannot run --ring (ring attention merges by the log-sum-exp h3app takes from cuDNN): use " \
               f"--attention cudnn or auto, or --ulysses."
    if split and not backend.context_parallel:
        return f"{flag} has no context-parallel support in diffusers 0.42.1: with --ulysses use --attention cudnn " \
               f"or auto."
    return None


def check_refusal(backend: AttentionBackend) -> str | None:
    """Why the equivalence check refuses ``backend`` (None: it runs). The check's verdict is about the model's
    exact math (it is what generate, grid and other engines reproduce); an approximate kernel rounds the attention
    its own way, so its A-vs-B verdict would speak for that kernel alone (docs/performance.md, "Attention")."""
    if backend.exact:
        return None
    return f"check compares runs bit for bit in exact attention; --attention {backend.name} is approximate " \
           f"({backend.label} rounds it its own way): run the check with --attention auto (or sdpa, fa3, flash, " \
           f"cudnn)."


def describe(backend: AttentionBackend, arch: str | None, asked: str = AUTO) -> str:
    """The start-up line's attention part: ``"attention: FlashAttention 3 (fa3, auto for this Hopper GPU)"``."""
    where = "the CPU" if arch is None else f"this {arch.capitalize() if arch in (HOPPER, BLACKWELL) else arch} GPU"
    how = f"auto for {where}" if asked == AUTO else "asked"
    return f"attention: {backend.label} ({backend.name}, {how})"
