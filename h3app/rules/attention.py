"""Attention backends: the app's names for diffusers' attention dispatcher backends, one entry per backend.

The app runs H3's attention through diffusers' dispatcher (``set_attention_backend`` / ``attention_backend``). Each
entry names the dispatcher's backend (``diffusers.models.attention_dispatch.AttentionBackendName`` values), the
Python module it needs, whether its output is exact (the same math as SDPA up to float rounding, so the equivalence
check's bitwise pair stays meaningful) and the GPU architectures it is the first choice on. Torch-free: the CLI's
flag parser, the plan and the start-up line read it without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass

HOPPER, BLACKWELL = "hopper", "blackwell"  # sm90 (H100, H200); sm100/sm120 (B200, B300, RTX PRO 6000)


@dataclass(frozen=True)
class AttentionBackend:
    """One attention backend. ``name``: the app's spelling (``--attention``); ``dispatcher``: diffusers'
    ``AttentionBackendName`` value; ``module``: the import that must succeed for it to run (None: in torch);
    ``exact``: same math as SDPA (False: quantised, e.g. Sage); ``first_on``: architectures it is picked first on."""

    name: str
    dispatcher: str
    module: str | None
    exact: bool
    first_on: tuple[str, ...] = ()
    label: str = ""


SDPA = AttentionBackend("sdpa", "native", None, True, (), "PyTorch SDPA")
FA3 = AttentionBackend("fa3", "_flash_3", "flash_attn_interface", True, (HOPPER,), "FlashAttention 3")
FA2 = AttentionBackend("flash", "flash", "flash_attn", True, (), "FlashAttention 2")
CUDNN = AttentionBackend("cudnn", "_native_cudnn", None, True, (BLACKWELL,), "cuDNN attention")
SAGE = AttentionBackend("sage", "sage", "sageattention", False, (), "SageAttention (8-bit, approximate)")

ATTENTION_BACKENDS: tuple[AttentionBackend, ...] = (SDPA, FA3, FA2, CUDNN, SAGE)
BY_NAME = {b.name: b for b in ATTENTION_BACKENDS}
AUTO = "auto"  # --attention auto (the default): the fastest exact backend installed for the card
ATTENTION_CHOICES = (AUTO, *BY_NAME)


def choose(arch: str | None, installed: frozenset[str] | set[str], asked: str = AUTO) -> AttentionBackend:
    """The backend a run uses. ``arch``: the GPU's architecture (:data:`HOPPER`, :data:`BLACKWELL`, another name, or
    None for a CPU); ``installed``: the importable modules among the entries' ``module`` values; ``asked``: the
    ``--attention`` value. ``auto`` picks the first exact backend for the architecture whose module is installed,
    else SDPA (on a CPU always SDPA: nothing changes there). A named backend is returned as asked; whether it can
    run is the loader's check."""
    if asked != AUTO:
        return BY_NAME[asked]
    if arch is None:
        return SDPA
    for backend in ATTENTION_BACKENDS:
        if arch in backend.first_on and backend.exact and (backend.module is None or backend.module in installed):
            return backend
    return SDPA
