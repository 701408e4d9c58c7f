"""Replay: identical calls under fake CUDA run once per signature and are repeated from their recording.

Fake execution depends on shapes only, so a second call of a layer (or method) with the same tensors and inputs
allocates the same outputs and peaks the same transient above what is live; the replay bumps the byte counter by
that transient, repeats the recording's FLOPs, moved bytes and ops (``counter.work``), and hands back fresh outputs
of the recorded layout. The rehearsal replays the transformer's blocks, the text encoder's layers, the video VAE's
clips, tiles and blocks and the audio decoder's activations (docs/hardware.md, "Fake CUDA").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..model.torch_compat import tree_flatten, tree_unflatten
from .fake_cuda import ByteCounter

REPLAYED = "replayed"  # the phase a recorded call runs under (``replayed``, ``replayed#1`` when nested)


def is_replay_phase(name: str) -> bool:
    """Whether ``name`` is a replay recording's own phase (not a phase of the request)."""
    return name.split("#")[0] == REPLAYED


def replay_repeats(modules: Sequence[torch.nn.Module], counter: ByteCounter) -> Any:
    """Run each of ``modules`` for real (fake) once per signature and replay later calls with the same signature:
    fake execution depends on shapes only, so a repeat allocates the same outputs and peaks the same transient
    above what is live. The signature is the module's class, its tensors (parameters, buffers and LoRA factors:
    shape, dtype, device) and its inputs', so identical sibling layers share one recording — the VAE decoder's
    dozens of identical tiles, the text encoder's decoder layers, the transformer's blocks. A replay also repeats
    the FLOPs the recording counted (``counter.work``). Returns the undo."""
    return replay_calls([(module, "forward") for module in modules], counter)


def replay_calls(methods: Sequence[tuple[torch.nn.Module, str]], counter: ByteCounter) -> Any:
    """:func:`replay_repeats` for any method of a module (``(module, name)``; ``forward`` for a layer): the video
    VAE's per-clip decode, whose clips all have one shape. Calls may nest (a recorded clip decode records its
    first tiles). Returns the undo."""
    recorded: dict[tuple, tuple[int, Any, list[Any], Any]] = {}

    def install(module: torch.nn.Module, name: str) -> None:
        original = getattr(module, name)

        def replaying(*args: Any, **kwargs: Any) -> Any:
            key = (type(module).__name__, name, _tensors_of(module),
                   tuple(_describe(a) for a in tree_flatten((args, kwargs))[0]))
            if key in recorded:
                return _replay(recorded[key], counter)
            out, record = _record(original, args, kwargs, counter)
            if record is not None:
                recorded[key] = record
            return out

        setattr(module, name, replaying)

    for module, name in methods:
        install(module, name)
    return lambda: [module.__dict__.pop(name, None) for module, name in methods]


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), tuple(value.stride()), value.dtype, str(value.device))
    return value if isinstance(value, (int, float, str, bool, type(None))) else type(value).__name__


def _record(original: Any, args: tuple, kwargs: dict[str, Any],
            counter: ByteCounter) -> tuple[Any, tuple[int, Any, list[Any], Any] | None]:
    """Run ``original`` under its own phase; (its output, the record a replay needs — None when the output is not
    plain tensors)."""
    start = counter.device_live
    work = counter.work.snapshot() if counter.work is not None else None
    depth = sum(map(is_replay_phase, counter.open_phases))  # a recording inside a recording gets its own phase
    phase = f"{REPLAYED}#{depth}" if depth else REPLAYED
    counter.begin(phase)
    try:
        out = original(*args, **kwargs)
    finally:
        counter.end(phase)
    transient = counter.phases.pop(phase).peak - start
    work = counter.work.since(work) if counter.work is not None else None
    leaves, spec = tree_flatten(out)
    if leaves and all(isinstance(x, torch.Tensor) and not x.requires_grad for x in leaves):
        return out, (transient, spec, [_describe(x) for x in leaves], work)
    return out, None


def _replay(record: tuple[int, Any, list[Any], Any], counter: ByteCounter) -> Any:
    """A recorded call again: its transient above what is live now, its work, fresh outputs of its layout."""
    transient, spec, outputs, work = record
    counter.bump(counter.device_live + transient)
    if work and counter.work is not None:
        counter.work.repeat(work)
    return tree_unflatten([torch.empty_strided(shape, stride, dtype=dtype, device=device)
                           for shape, stride, dtype, device in outputs], spec)


def _tensors_of(module: torch.nn.Module) -> tuple:
    """Shape, dtype and device of every parameter, buffer and LoRA factor (``lora_entries``) under ``module``."""
    found: list[Any] = []
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        found.append((name, tuple(tensor.shape), tensor.dtype, str(tensor.device)))
    for name, sub in module.named_modules():
        for index, entry in enumerate(getattr(sub, "lora_entries", ())):
            for factor in (entry.down, entry.up):
                found.append((name, index, tuple(factor.shape), factor.dtype, str(factor.device)))
    return tuple(found)
