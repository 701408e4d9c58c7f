"""``--compile``: ``torch.compile`` on the transformer's repeated blocks, and what dynamo reports about it.

Only the blocks are compiled (the model's code is diffusers', traced as is): identical blocks share one graph, and
the LoRA wrappers inside them are traced too. Nothing that changes between requests is a Python constant in the
graph: the LoRA effective scales are fp32 tensors refilled in place (``h3app.lora.scaling``), so alpha, strength
and group-strength changes, and swapping one adapter for another of the same ranks, run the graphs already built.
Backend: inductor on CUDA; ``aot_eager`` elsewhere (no code generation: the CPU runs the tiny checkpoint, where
compiling buys nothing and a C++ toolchain may be missing).
"""

from __future__ import annotations

from typing import Any

import torch

BLOCK_LISTS = ("transformer_blocks", "single_transformer_blocks", "token_refiner", "refiner_blocks")


def compile_backend(device: str | torch.device) -> str:
    """The ``torch.compile`` backend for ``device``: inductor on CUDA, ``aot_eager`` elsewhere."""
    return "inductor" if torch.device(device).type == "cuda" else "aot_eager"


def blocks_of(transformer: torch.nn.Module) -> list[torch.nn.Module]:
    """The members of every ``ModuleList`` of the transformer whose members are all one class (its blocks)."""
    found: list[torch.nn.Module] = []
    for sub in transformer.modules():
        if isinstance(sub, torch.nn.ModuleList) and len(sub) > 0 and len({type(m) for m in sub}) == 1 \
                and any(True for _ in sub[0].children()):
            found.extend(sub)
    return found


def compile_blocks(transformer: torch.nn.Module, device: str | torch.device) -> int:
    """``torch.compile`` every block of ``transformer`` in place (``nn.Module.compile``); returns how many."""
    blocks = blocks_of(transformer)
    backend = compile_backend(device)
    for block in blocks:
        block.compile(backend=backend, dynamic=False)
    return len(blocks)


def compile_report() -> dict[str, int]:
    """``{graphs, recompiles}`` so far in this process, from dynamo's own counters: graphs built, and compiles
    caused by a guard failing on an already-compiled frame."""
    from torch._dynamo.utils import counters, guard_failures

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "recompiles": int(sum(len(reasons) for reasons in guard_failures.values()))}


def is_compiled(module: Any) -> bool:
    """Whether ``module`` (a block) runs through ``torch.compile``."""
    return getattr(module, "_compiled_call_impl", None) is not None
