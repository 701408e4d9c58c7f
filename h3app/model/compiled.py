"""``--compile``: ``torch.compile`` on the transformer's repeated blocks, and what dynamo reports about it.

Only the blocks are compiled (the model's code is diffusers', traced as is): identical blocks share one graph, and
the LoRA wrappers inside them are traced too. Nothing that changes between requests may change what the graphs see,
or dynamo recompiles (minutes each on the 33B model):

- **LoRA settings** are fp32 tensors refilled in place (``h3app.lora.scaling``), so alpha, strength and
  group-strength changes, and swapping one adapter for another of the same ranks, run the graphs already built.
- **The no-LoRA baseline** keeps the LoRA wrappers in place at strength 0 (``AdapterBinder.baseline``): detaching
  would swap the blocks' ``LoRALinear`` back to ``nn.Linear``, a new module class under the graphs. A zero strength
  was chosen over one graph per structure: one graph per block kind compiles once (on the full model that is
  minutes saved per structure), at the price of the delta's FLOPs in the baseline (~2 % of a step at 544p), and its
  output equals the detached model's (tested bit for bit on the tiny model).
- **Deterministic algorithms** are on for every run of a compiled transformer (:func:`compiled_runs`), as the
  equivalence check runs: dynamo guards that global switch, so a check after a generate would recompile every
  block. The forward kernels H3 runs are deterministic anyway; what it adds is torch's filling of memory
  ``torch.empty`` hands out.
- **The time embedding's batch** is the number of distinct timesteps in the packed sequence: 1 on the first step of
  a text-to-video run (video and audio both at t = 0), 2 after, up to 4 with conditioning rows. A single timestep is
  given a second, equal row that no row indexes (:func:`keep_timestep_rows`), and the embedding's first dimension
  is left symbolic from 2 to :data:`MAX_TIMESTEP_ROWS`, so every step runs one graph. That first step's output can
  round differently from an uncompiled run (inductor's fused kernels already do); A and B of the check get the same
  padding, so they stay bit-identical.

Backend: inductor on CUDA; ``aot_eager`` elsewhere (no code generation: the CPU runs the tiny checkpoint, where
compiling buys nothing and a C++ toolchain may be missing).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

# Distinct timesteps one H3 forward can carry: video rows, audio rows, conditioning video rows (keyframes,
# references: pinned at their noise level) and reference audio rows (diffusers' ``build_row_timesteps``).
MAX_TIMESTEP_ROWS = 4
# the plain attributes this module keeps on the modules it changes: compiled or not, the timestep hooks' handles
COMPILED, TIMESTEP_HOOKS = "_h3app_compiled", "_h3app_timestep_hooks"


def _mark(module: torch.nn.Module, name: str, value: object) -> None:
    """Keep ``value`` as the plain attribute ``name`` of ``module``. (torch types ``Module.__setattr__``'s value as
    ``Tensor | Module``; any other value is stored as an ordinary attribute, which ``setattr`` says in its types.)"""
    setattr(module, name, value)


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
    """``torch.compile`` every block's ``forward`` of ``transformer`` in place; returns how many. The transformer's
    timestep rows are kept in one graph's range (:func:`keep_timestep_rows`).

    The block's ``forward`` is compiled, not its whole call (``nn.Module.compile``): hooks put around a block
    (diffusers' first-block cache decides in Python whether the block runs at all, ``model/denoise_cache.py``;
    diffusers' group offload) stay outside the graph, so their state never becomes a guard."""
    blocks = blocks_of(transformer)
    backend = compile_backend(device)
    for block in blocks:
        block.forward = torch.compile(block.forward, backend=backend, dynamic=False)
        _mark(block, COMPILED, True)
    keep_timestep_rows(transformer)
    _mark(transformer, COMPILED, True)
    return len(blocks)


def uncompile_blocks(transformer: torch.nn.Module) -> None:
    """Undo :func:`compile_blocks`: the blocks run eagerly again, and the timestep hooks are gone."""
    for block in blocks_of(transformer):
        if is_compiled(block):
            vars(block).pop("forward", None)
            _mark(block, COMPILED, False)
    for handle in getattr(transformer, TIMESTEP_HOOKS, None) or ():
        handle.remove()
    _mark(transformer, TIMESTEP_HOOKS, None)
    _mark(transformer, COMPILED, False)


def is_compiled(module: torch.nn.Module) -> bool:
    """Whether :func:`compile_blocks` compiled ``module``'s blocks (or ``module``, one of them)."""
    return bool(getattr(module, COMPILED, False))


@contextmanager
def compiled_runs(transformer: torch.nn.Module) -> Iterator[None]:
    """Around one pipeline run of ``transformer``: when it is compiled, deterministic algorithms on (restored after),
    so every run meets the graphs' guards on that switch as the equivalence check does; otherwise nothing."""
    if not is_compiled(transformer) or torch.are_deterministic_algorithms_enabled():
        yield
        return
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def keep_timestep_rows(transformer: torch.nn.Module) -> None:
    """Hooks on an H3 transformer (one with a ``time_embedder``; others are left alone): a forward with one distinct
    timestep gets it twice (``timestep_indices`` still point at row 0), and the embedding's first dimension is
    marked symbolic in ``[2, MAX_TIMESTEP_ROWS]``."""
    embedder = getattr(transformer, "time_embedder", None)
    if embedder is None or getattr(transformer, TIMESTEP_HOOKS, None):
        return
    from .torch_compat import mark_dynamic

    def two_rows(module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]] | None:
        timestep = kwargs.get("timestep")
        if isinstance(timestep, torch.Tensor) and timestep.ndim == 1 and timestep.shape[0] == 1:
            return args, {**kwargs, "timestep": timestep.repeat(2)}
        return None

    def symbolic(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
        if isinstance(output, torch.Tensor) and 2 <= output.shape[0] <= MAX_TIMESTEP_ROWS:
            mark_dynamic(output, 0)

    _mark(transformer, TIMESTEP_HOOKS, [transformer.register_forward_pre_hook(two_rows, with_kwargs=True),
                                        embedder.register_forward_hook(symbolic)])


def compile_report() -> dict[str, int]:
    """``{graphs, recompiles}`` so far in this process, from dynamo's own counters: graphs built, and compiles
    caused by a guard failing on an already-compiled frame."""
    from .torch_compat import dynamo_counters

    counters, guard_failures = dynamo_counters()
    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "recompiles": int(sum(len(reasons) for reasons in guard_failures.values()))}
