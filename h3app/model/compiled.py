"""``--compile``: ``torch.compile`` on the transformer's repeated blocks, and what dynamo reports about it.

Only the blocks are compiled (the model's code is diffusers', traced as is): identical blocks share one graph, and
the LoRA wrappers inside them are traced too. Nothing that changes between requests is a Python constant in the
graph: the LoRA effective scales are fp32 tensors refilled in place (``h3app.lora.scaling``), so alpha, strength
and group-strength changes, and swapping one adapter for another of the same ranks, run the graphs already built.
Backend: inductor on CUDA; ``aot_eager`` elsewhere (no code generation: the CPU runs the tiny checkpoint, where
compiling buys nothing and a C++ toolchain may be missing).
"""

from __future__ import annotations

import torch


def compile_backend(device: str | torch.device) -> str:
    """The ``torch.compile`` backend for ``device``: inductor on CUDA, ``aot_eager`` elsewhere."""
    return "inductor" if torch.device(device).type == "cuda" else "aot_eager"


def blocks_of(module: torch.nn.Module, at_least: int = 1) -> list[torch.nn.Module]:
    """The members of every ``ModuleList`` of ``module`` with ``at_least`` members, all of one (non-leaf) class:
    transformer blocks, decoder layers."""
    found: list[torch.nn.Module] = []
    for sub in module.modules():
        if isinstance(sub, torch.nn.ModuleList) and len(sub) >= max(at_least, 1) and len({type(m) for m in sub}) == 1 \
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
    from .torch_compat import dynamo_counters

    counters, guard_failures = dynamo_counters()
    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "recompiles": int(sum(len(reasons) for reasons in guard_failures.values()))}
