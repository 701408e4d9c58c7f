"""A fake GPU box: fake CUDA (``fake_cuda.py``) plus the CUDA driver calls that diffusers' offload hooks make.

``--offload auto`` (``ComponentsManager`` auto CPU offload) asks the driver how much memory is free and moves whole
components between host and device; ``--offload group`` (block-level group offload with a side stream) copies each
block's weights through pinned host memory on a CUDA stream and swaps them in with ``param.data = …``. Inside
:func:`fake_gpu_box` those calls are answered without a driver:

- ``torch.cuda.is_available`` / ``device_count`` / ``current_device``: one GPU, index 0;
- ``torch.cuda.mem_get_info``: ``(gpu_bytes - live fake device bytes, gpu_bytes)``, so the offload strategy sees
  the memory the weights it placed actually hold;
- streams, events, ``synchronize``, ``empty_cache``: no-ops (fake tensors have no values to wait for);
- ``Tensor.pin_memory``: a host copy (the bytes count the same; page-locking needs a driver);
- ``param.data = t`` where either side is fake: the parameter object takes ``t``'s tensor in place (the mode refuses
  this as a plain ``set_data``, and a fake tensor's device would go stale), so hooks that key on parameter
  objects keep working;
- jobs of an h3app ``Worker`` started inside run on the same fake CUDA (dispatch modes are per thread).

Every replacement is undone on exit, on error too. :class:`DriverLog` counts what the hooks asked for and the
moves they made, so a test can tell that offloading happened.
"""

from __future__ import annotations

import collections
import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..model.torch_compat import TENSOR_DATA, FakeTensor, fake_tensor_tls
from .fake_cuda import FakeCuda, fake_cuda, is_fake


@dataclass
class DriverLog:
    """``calls``: driver function name → times called; ``moves``: ``(from, to)`` device types → parameters or
    buffers re-pointed by ``.data =`` (group offload's onload/offload)."""

    calls: collections.Counter = field(default_factory=collections.Counter)
    moves: collections.Counter = field(default_factory=collections.Counter)


class FakeStream:
    """A CUDA stream or event that has nothing to wait for; each construction is counted in ``log``."""

    log: DriverLog | None = None
    kind = "Stream"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.device = torch.device("cuda", 0)
        if self.log is not None:
            self.log.calls[self.kind] += 1

    def synchronize(self) -> None:
        return None

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> FakeStream:
        return event or FakeStream()

    def record(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True


@dataclass
class FakeGpuBox:
    """One fake GPU of ``gpu_bytes`` (settable while the box is on: the driver reads it on every query), its fake
    CUDA ``mode`` (``mode.counter``: the bytes held) and the :class:`DriverLog`."""

    mode: FakeCuda
    gpu_bytes: int
    log: DriverLog = field(default_factory=DriverLog)


def _driver_functions(box: FakeGpuBox) -> dict[str, Any]:
    """``torch.cuda`` name → its stand-in. Free memory: the box's ``gpu_bytes`` less what fake CUDA holds now."""
    log = box.log

    def counted(name: str, answer: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            log.calls[name] += 1
            return answer(*args, **kwargs)

        return call

    return {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": counted("set_device", lambda device: None),
        "mem_get_info": counted("mem_get_info", lambda device=None: (
            max(0, box.gpu_bytes - box.mode.counter.device_live), box.gpu_bytes)),
        "empty_cache": counted("empty_cache", lambda: None),
        "synchronize": counted("synchronize", lambda device=None: None),
        "Stream": type("Stream", (FakeStream,), {"log": log, "kind": "Stream"}),
        "Event": type("Event", (FakeStream,), {"log": log, "kind": "Event"}),
        "current_stream": counted("current_stream", lambda device=None: FakeStream()),
        "default_stream": counted("default_stream", lambda device=None: FakeStream()),
        "stream": counted("stream", lambda stream=None: contextlib.nullcontext(stream)),
    }


def _is_data_setter(func: Any) -> bool:
    return getattr(func, "__name__", "") == "__set__" and getattr(func, "__self__", None) is TENSOR_DATA


def _forget_weak_references(tensor: torch.Tensor, mode: FakeCuda) -> None:
    """Drop the fake mode's weak bookkeeping of ``tensor`` (its memo of converted tensors, the export tracker):
    ``swap_tensors`` refuses a weakly referenced tensor, and every fake tensor is one."""
    memo = mode.fake_tensor_converter.tensor_memo
    for ref in weakref.getweakrefs(tensor):
        key = getattr(ref, "key", None)  # the memo's references are keyed; the tracker's are not
        if key is not None and memo.get(key) is tensor:
            del memo[key]
    if isinstance(tensor, FakeTensor):  # the tracker holds fake tensors only
        fake_tensor_tls.non_strict_export_fake_tensor_tracker.discard(tensor)


def set_data(target: torch.Tensor, new: torch.Tensor, log: DriverLog) -> None:
    """``target.data = new`` keeping ``target``'s identity, where either is fake: ``target`` becomes a tensor (a
    parameter if it was one) on ``new``'s storage, device and dtype (swapped in place, as ``Module.to`` swaps fake
    parameters; group offload keys its host copies on the parameter objects)."""
    log.moves[(target.device.type, new.device.type)] += 1
    alias: torch.Tensor
    if isinstance(target, torch.nn.Parameter):
        alias = torch.nn.Parameter(new, requires_grad=target.requires_grad)
    else:
        alias = new.detach()
    torch.utils.swap_tensors(target, alias)


def _swapping(mode: FakeCuda) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """``torch.utils.swap_tensors`` that first drops the fake mode's weak references to both tensors (``Module.to``
    swaps every fake parameter it moves: an offload hook moving a component back to the host)."""
    original = torch.utils.swap_tensors

    def swap(first: torch.Tensor, second: torch.Tensor) -> None:
        for tensor in (first, second):
            _forget_weak_references(tensor, mode)
        original(first, second)

    return swap


class DriverKernels(TorchFunctionMode):
    """The tensor methods that need a driver or refuse fake tensors: ``pin_memory``, ``record_stream``, and
    ``.data =`` across fake and real."""

    def __init__(self, log: DriverLog) -> None:
        super().__init__()
        self.log = log

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_data_setter(func) and (is_fake(args[0]) or is_fake(args[1])):
            return set_data(args[0], args[1], self.log)
        if func is torch.Tensor.pin_memory:
            self.log.calls["pin_memory"] += 1
            return args[0].clone()
        if func is torch.Tensor.is_pinned:
            return False
        if func is torch.Tensor.record_stream:
            return None
        return func(*args, **kwargs)


@contextlib.contextmanager
def _replaced(owner: Any, replacements: dict[str, Any]) -> Iterator[None]:
    """Set ``owner.name = value`` for each of ``replacements``; restore every original on exit."""
    missing = object()
    originals = {name: getattr(owner, name, missing) for name in replacements}
    try:
        for name, value in replacements.items():
            setattr(owner, name, value)
        yield
    finally:
        for name, original in originals.items():
            if original is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


@contextlib.contextmanager
def _on_this_thread(mode: FakeCuda, log: DriverLog) -> Iterator[None]:
    with mode.on_this_thread(), DriverKernels(log):
        yield


def _worker_threads(mode: FakeCuda, log: DriverLog) -> contextlib.AbstractContextManager:
    """Workers started inside run their jobs on this fake CUDA: the worker thread owns the GPU."""
    from ..backend.worker import Worker

    original = Worker._loop

    def loop(self: Worker) -> None:
        with _on_this_thread(mode, log):
            original(self)

    return _replaced(Worker, {"_loop": loop})


@contextlib.contextmanager
def fake_gpu_box(gpu_bytes: int) -> Iterator[FakeGpuBox]:
    """Fake CUDA with one GPU of ``gpu_bytes`` and a driver that answers diffusers' offload hooks."""
    with fake_cuda() as mode:
        box = FakeGpuBox(mode, gpu_bytes)
        with _replaced(torch.cuda, _driver_functions(box)), _replaced(torch.utils, {"swap_tensors": _swapping(mode)}), \
                DriverKernels(box.log), _worker_threads(mode, box.log):
            yield box
