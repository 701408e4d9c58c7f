"""Fake CUDA: run h3app's own code at full size on a machine without a GPU, and count the bytes it would hold.

Inside :class:`FakeCuda` every tensor on device ``cuda`` is a ``FakeTensor`` (shape, dtype and device, no data), so
the 33B transformer "fits" on a laptop and every device, dtype or shape mistake that only a GPU would hit raises
here (mixing a cpu and a cuda tensor raises ``FakeTensorDeviceMismatchError``). CPU work stays real — schedulers,
generators, tokenizers and hashing run as usual — except CPU tensors of more than ``HOST_FAKE_ELEMENTS`` elements,
which are fake too (host memory is counted, never filled: a pristine copy of the weights would be 60 GB).

Values a GPU would compute are unknown, so three rules stand in for them:

- small tensors (≤ ``SHADOW_ELEMENTS`` elements) carry their real value beside the fake one (computed on the CPU),
  so data-dependent code on them (``nonzero``, ``unique``, ``.item()``) gets the real answer — the scheduler's
  timestep lookup, token-type masks, index tensors;
- a scalar read of a large fake tensor (``.item()``, ``bool()``) answers ``1`` / ``1.0`` / ``True``;
- copying a large fake tensor to the host gives a fake host tensor, and ``.numpy()`` of it gives zeros.

Attention: without a GPU, ``scaled_dot_product_attention`` would decompose into the math path (fp32 scores of
``[B, heads, L, L]``: 85 GB at 544p), which no H100/H200 runs. It is replaced by the fused op a GPU runs
(flash attention for bf16/fp16, memory-efficient attention otherwise), whose memory is the output plus an fp32
log-sum-exp of ``[B, heads, L]``.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from ..model.torch_compat import (
    EFFICIENT_ATTENTION,
    FLASH_ATTENTION,
    LOCAL_SCALAR_DENSE,
    TO_COPY,
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    op_arguments,
    tree_flatten,
    tree_map,
)

aten = torch.ops.aten
SHADOW_ELEMENTS = 1 << 16
KNOWN_VALUE = "_h3_value"  # the attribute a fake tensor keeps its known value in (small ones: the real CPU tensor)
HOST_FAKE_ELEMENTS = 1 << 20
DISPATCH_CACHE = True  # FakeCuda's use of torch's fake dispatch cache (tests compare counts with it off)
_CPU = torch.device("cpu")
# Ops whose CUDA kernels refuse mixed input dtypes, which their meta kernels do not check.
_SAME_DTYPE = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.mv.default,
               aten.addmv.default, aten.convolution.default, FLASH_ATTENTION.default, EFFICIENT_ATTENTION.default}
_EMPTIES = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default}
_FACTORIES = {aten.empty.memory_format, aten.empty_strided.default, aten.zeros.default, aten.ones.default,
              aten.full.default, aten.randn.default, aten.rand.default, aten.empty_like.default,
              aten.zeros_like.default, aten.randn_like.default}


def is_fake(value: Any) -> bool:
    return isinstance(value, FakeTensor)


@dataclass
class PhaseBytes:
    """Device bytes of one phase: ``start`` (live when it began) and ``peak`` (highest live while it ran)."""

    start: int = 0
    peak: int = 0

    @property
    def transient(self) -> int:
        """Bytes the phase added on top of what was resident when it began."""
        return max(0, self.peak - self.start)


@dataclass
class ByteCounter:
    """Live and peak bytes of fake storages, on the device and on the host, with per-phase peaks."""

    device_live: int = 0
    device_peak: int = 0
    host_live: int = 0
    host_peak: int = 0
    phases: dict[str, PhaseBytes] = field(default_factory=dict)
    _open: list[str] = field(default_factory=list)
    _runs: dict[str, PhaseBytes] = field(default_factory=dict)
    _depth: dict[str, int] = field(default_factory=dict)
    _sizes: dict[int, tuple[bool, int]] = field(default_factory=dict)
    work: Any = None  # a ``work.WorkCounter`` counting FLOPs beside the bytes (replays repeat its counts too)

    @property
    def open_phases(self) -> tuple[str, ...]:
        """The phases open now, outermost first."""
        return tuple(self._open)

    def add(self, tensor: FakeTensor) -> None:
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._sizes:
            return
        on_device = tensor.device.type == "cuda"
        size = int(storage.nbytes())
        self._sizes[key] = (on_device, size)
        if on_device:
            self.device_live += size
            self.device_peak = max(self.device_peak, self.device_live)
            for name in self._open:
                self._runs[name].peak = max(self._runs[name].peak, self.device_live)
        else:
            self.host_live += size
            self.host_peak = max(self.host_peak, self.host_live)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        on_device, size = self._sizes.pop(key)
        if on_device:
            self.device_live -= size
        else:
            self.host_live -= size

    def bump(self, live: int) -> None:
        """Record a device high-water mark of ``live`` bytes (a replayed call's transient)."""
        self.device_peak = max(self.device_peak, live)
        for name in self._open:
            self._runs[name].peak = max(self._runs[name].peak, live)

    def begin(self, name: str) -> None:
        """Start recording phase ``name`` (nested re-entry of an open phase is ignored)."""
        if name in self._open:
            self._depth[name] = self._depth.get(name, 0) + 1
            return
        self._open.append(name)
        self._runs[name] = PhaseBytes(self.device_live, self.device_live)

    def end(self, name: str) -> None:
        """Close phase ``name``; a phase run several times keeps its largest transient."""
        if self._depth.get(name):
            self._depth[name] -= 1
            return
        self._open.remove(name)
        run = self._runs.pop(name)
        previous = self.phases.get(name)
        if previous is None or run.transient >= previous.transient:
            self.phases[name] = run

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.begin(name)
        try:
            yield
        finally:
            self.end(name)


class FakeCuda(FakeTensorMode):
    """The fake-CUDA mode (see the module docstring). ``counter`` holds its byte counts."""

    def __init__(self) -> None:
        super().__init__(allow_non_fake_inputs=True)
        # FakeTensorMode's dispatch cache (output metadata by op and input metadata) is what makes a repeated op
        # cheap: a decomposed op such as layer_norm is one lookup instead of a dozen nested dispatches (~6× faster
        # per block). It is safe beside known values: those are computed by __torch_dispatch__ on every call, not
        # cached, and torch bypasses the cache wherever output metadata depends on more than input metadata
        # (data-dependent or dynamic shapes, constants, real inputs). DISPATCH_CACHE off: every op dispatched afresh.
        self.cache_enabled = DISPATCH_CACHE
        self.counter = ByteCounter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: C901 - one dispatch table
        kwargs = kwargs or {}
        if kwargs.get("pin_memory"):  # page-locked host memory needs a driver; the bytes count the same
            kwargs = {**kwargs, "pin_memory": False}
        flat = tree_flatten((args, kwargs))[0]
        fakes = [x for x in flat if is_fake(x)]
        to_device = _targets_cuda(flat, kwargs)
        if not fakes and not to_device:
            if func in _FACTORIES and _numel(func, args, kwargs) > HOST_FAKE_ELEMENTS:
                return self._dispatch_fake(func, types, args, kwargs)  # a large host buffer: counted, not filled
            out = func(*args, **kwargs)
            if func in _EMPTIES:
                out.zero_()  # host buffers filled from fake device data would otherwise hold garbage (NaN)
            return out
        if func is TO_COPY and not fakes and args[0].is_meta:
            # A module built on meta and moved to the GPU: the weights "loaded" there, uninitialised.
            source = args[0]
            return self._dispatch_fake(aten.empty_strided.default, types, (source.shape, source.stride()),
                                       {"dtype": kwargs.get("dtype") or source.dtype, "device": torch.device("cuda")})
        if func is TO_COPY and not fakes and _plain_copy(kwargs):
            # A real host tensor moved to the GPU (a loaded module's .to("cuda")): a fake of its layout, carrying
            # the value when small — what the general path computes, without decomposing the copy.
            source = args[0]
            dtype = kwargs.get("dtype") or source.dtype
            out = self._dispatch_fake(aten.empty_strided.default, types, (source.shape, source.stride()),
                                      {"dtype": dtype, "device": _target_device(args, kwargs)})
            if source.numel() <= SHADOW_ELEMENTS:
                _know(out, source.to(dtype=dtype, copy=True))
            return out
        shadows = _shadow_arguments(args, kwargs)
        if func is TO_COPY and fakes and _target_device(args, kwargs).type == "cpu" and shadows:
            return func(*shadows[0], **shadows[1])  # a small value copied to the host: the real value
        if func in _SAME_DTYPE:
            _check_same_dtype(func, args)
        try:
            out = self._dispatch_fake(func, types, args, kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException):
            if shadows is None:
                if func is LOCAL_SCALAR_DENSE:
                    return _placeholder_scalar(args[0].dtype)
                if func is aten.equal.default:
                    return False  # unknown values: treat as different (never merges two factors wrongly)
                raise
            return tree_map(self._fake_of, func(*shadows[0], **shadows[1]))
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        real = _values(func, shadows) if shadows is not None and all(
            t.numel() <= SHADOW_ELEMENTS for t in outputs) else None
        if real is not None:
            for fake, value in zip(tree_flatten(out)[0], real):
                if is_fake(fake) and isinstance(value, torch.Tensor):
                    _know(fake, value)
        else:
            for index, argument in enumerate(op_arguments(func)[:len(args)]):
                if argument.alias_info is not None and argument.alias_info.is_write and is_fake(args[index]):
                    args[index].__dict__.pop(KNOWN_VALUE, None)  # written without known values: value unknown
        return out

    @contextlib.contextmanager
    def on_this_thread(self) -> Iterator[FakeCuda]:
        """Dispatch modes are per thread: enter this same mode (same counter) on a worker thread."""
        with self, FusedKernels():
            yield self

    def _dispatch_fake(self, func, types, args, kwargs):
        def fake(value: Any) -> Any:
            return self.from_tensor(value) if isinstance(value, torch.Tensor) and not is_fake(value) else value

        out = super().__torch_dispatch__(func, types, tree_map(fake, args), tree_map(fake, kwargs))
        for tensor in tree_flatten(out)[0]:
            if is_fake(tensor):
                self.counter.add(tensor)
        return out

    def _fake_of(self, value: Any) -> Any:
        """A fake CUDA tensor carrying ``value`` (a real CPU tensor) as its known value."""
        if not isinstance(value, torch.Tensor):
            return value
        with self:
            out = self.from_tensor(value).to("cuda")
        _know(out, value)
        return out


def _know(fake: torch.Tensor, value: torch.Tensor) -> None:
    """Keep ``value`` (a real CPU tensor) as ``fake``'s known value, a plain attribute of the tensor."""
    setattr(fake, KNOWN_VALUE, value)


def _targets_cuda(flat: list[Any], kwargs: dict[str, Any]) -> bool:
    device = kwargs.get("device")
    return any(isinstance(x, torch.device) and x.type == "cuda" for x in flat) or (
        isinstance(device, str) and device.startswith("cuda"))


def _plain_copy(kwargs: dict[str, Any]) -> bool:
    """A ``_to_copy`` that only changes device and/or dtype (strides preserved, dense layout)."""
    return kwargs.get("memory_format") in (None, torch.preserve_format) and kwargs.get("layout") in (None, torch.strided)


def _target_device(args: tuple, kwargs: dict[str, Any]) -> torch.device:
    device = kwargs.get("device")
    return torch.device(device) if device is not None else args[0].device


def _numel(func, args: tuple, kwargs: dict[str, Any]) -> int:
    if func in (aten.empty_like.default, aten.zeros_like.default, aten.randn_like.default):
        return args[0].numel()
    size = args[0] if args else kwargs.get("size", ())
    total = 1
    for dim in size if isinstance(size, (list, tuple)) else (size,):
        total *= int(dim)
    return total


def _shadow_arguments(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
    """``args``/``kwargs`` with every fake tensor replaced by its known value and cuda by cpu; None when a fake
    tensor's value is unknown or a real tensor is too large to repeat the op on."""
    known = [True]

    def value(x: Any) -> Any:
        if is_fake(x):
            shadow = x.__dict__.get(KNOWN_VALUE)
            known[0] = known[0] and shadow is not None
            return shadow
        if isinstance(x, torch.Tensor) and x.numel() > SHADOW_ELEMENTS:
            known[0] = False
        if isinstance(x, torch.device) and x.type == "cuda":
            return _CPU
        return x

    new_args, new_kwargs = tree_map(value, args), tree_map(value, kwargs)
    if isinstance(new_kwargs.get("device"), str):
        new_kwargs["device"] = "cpu"
    return (new_args, new_kwargs) if known[0] else None


def _check_same_dtype(func, args: tuple) -> None:
    dtypes = {t.dtype for t in args if isinstance(t, torch.Tensor) and t.dtype.is_floating_point}
    if len(dtypes) > 1:
        names = " != ".join(sorted(str(d).replace("torch.", "") for d in dtypes))
        raise RuntimeError(f"{func}: expected all inputs to have the same dtype, but got {names} "
                           f"(a GPU refuses this)")


def _values(func, shadows: tuple[tuple, dict[str, Any]]) -> list[Any] | None:
    """The op run on known values on the CPU; None where the CPU has no kernel for it (GPU-only fused ops)."""
    try:
        return tree_flatten(func(*shadows[0], **shadows[1]))[0]
    except (NotImplementedError, RuntimeError):
        return None


def _placeholder_scalar(dtype: torch.dtype) -> bool | int | float:
    if dtype == torch.bool:
        return True
    return 1.0 if dtype.is_floating_point or dtype.is_complex else 1


class FusedKernels(TorchFunctionMode):
    """What a GPU runs where the CPU decomposition would differ in memory: fused attention; and host arrays of
    fake host tensors (zeros) so that code after the GPU part runs."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            query = args[0] if args else kwargs.get("query")
            if is_fake(query):
                return fused_attention(*args, **kwargs)
        device = kwargs.get("device")
        if func is torch.tensor and device is not None and torch.device(device).type == "cuda":
            # Built on the host then moved, as the GPU build does; the direct path would initialise a real CUDA.
            data = _plain_numbers(args[0] if args else kwargs.pop("data"))
            return func(data, *args[1:], **{**kwargs, "device": "cpu"}).to(device)
        if func is torch.Tensor.numpy and is_fake(args[0]):
            tensor = args[0]
            return np.zeros(tuple(tensor.shape), dtype=torch.empty((), dtype=tensor.dtype).numpy().dtype)
        return func(*args, **kwargs)


def _plain_numbers(data: Any) -> Any:
    """Nested lists of fake scalars → Python numbers (their known values), as ``torch.tensor`` reads them."""
    if is_fake(data):
        return data.tolist()
    if isinstance(data, (list, tuple)):
        return type(data)(_plain_numbers(item) for item in data)
    return data


def fused_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
    """``scaled_dot_product_attention`` as a GPU runs it: flash attention (bf16/fp16, no mask) or
    memory-efficient attention. ``query`` ``[B, heads, L, D]`` → ``[B, heads, L, Dv]``."""
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeat, dim=-3), value.repeat_interleave(repeat, dim=-3)
    if attn_mask is None and query.dtype in (torch.bfloat16, torch.float16) and query.shape[-1] <= 256:
        return FLASH_ATTENTION(query, key, value, dropout_p, is_causal, False, scale=scale)[0]
    bias = attn_mask
    if bias is not None and bias.dtype == torch.bool:
        bias = torch.zeros(bias.shape, dtype=query.dtype, device=query.device).masked_fill(~bias, float("-inf"))
    return EFFICIENT_ATTENTION(query, key, value, bias, False, dropout_p, is_causal, scale=scale)[0]


@contextlib.contextmanager
def _plain_parameter_conversion() -> Iterator[None]:
    """``Module.to()`` swaps a tensor-subclass parameter in place, which refuses a weakly referenced one (every
    fake parameter is); a real GPU parameter is a plain tensor and takes the ``param.data = …`` path, so fake ones
    are made to take it too while fake CUDA is on."""
    import torch.nn.modules.module as module_module

    original = module_module.is_traceable_wrapper_subclass
    # torch types the name as a TypeIs predicate; Module.to only reads the stand-in's bool
    module_module.is_traceable_wrapper_subclass = lambda t: False if is_fake(t) else original(t)  # type: ignore[assignment]
    try:
        yield
    finally:
        module_module.is_traceable_wrapper_subclass = original


NO_CAPABILITY = (0, 0)  # what fake CUDA answers for a device's compute capability on a machine without a driver


@contextlib.contextmanager
def _capability_without_a_driver() -> Iterator[None]:
    """On a machine without a CUDA driver, ``torch.cuda.get_device_capability`` answers :data:`NO_CAPABILITY` (an
    architecture no attention rule knows: the loader keeps SDPA, whose fused kernel the rehearsal counts; the plan
    prices each card's backend itself, ``attention_speed``). With a driver the real answer stands."""
    if torch.cuda.is_available():
        yield
        return
    original = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda device=None: NO_CAPABILITY  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.get_device_capability = original


@contextlib.contextmanager
def fake_cuda() -> Iterator[FakeCuda]:
    """Enter fake CUDA (with fused attention); yields the mode, whose ``counter`` holds the bytes."""
    mode = FakeCuda()
    with _plain_parameter_conversion(), _capability_without_a_driver(), mode, FusedKernels():
        yield mode
