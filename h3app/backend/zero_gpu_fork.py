"""The ZeroGPU stand-in (``H3APP_ZEROGPU_FORK=1``): a decorated generator call runs in a forked child, as
``spaces`` runs it on a ZeroGPU Space (``spaces/zero/wrappers.py``, ``generator_function_wrapper``).

Like ``spaces``: the duration callable is read with the call's arguments (and must give a positive whole number of
seconds); the arguments travel to the child pickled and each yielded item comes back pickled (so a call that only
works by sharing memory with the parent fails here too); what the child changes in the model dies with it; the
caller closing the generator stops the call. Unlike ``spaces``, every call gets a fresh child (``spaces`` reuses an
idle one, so a call may find either state: a job may rely on neither), and a cancelled child that does not stop
within :data:`STOP_SECONDS` is killed.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import time
from collections.abc import Callable, Generator
from typing import Any

from ..errors import H3AppError

STOP_SECONDS = 30.0  # a stopped child's time to end its job at a step boundary before it is killed
_HEADER = struct.Struct("!Q")
_OK, _ERROR, _END = 0, 1, 2
asked: list[int] = []  # every duration a call declared in this process (tests read it, as the platform would)
children: list[int] = []  # every child's pid, in order (tests check that a cancelled one is gone)


def _send(fd: int, tag: int, value: Any) -> None:
    data = pickle.dumps((tag, value))
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(fd: int) -> tuple[int, Any] | None:
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    data = _read_exact(fd, _HEADER.unpack(header)[0])
    return None if data is None else pickle.loads(data)


def _child(fn: Callable[..., Generator[Any, None, None]], arguments: bytes, out: int, stop: int) -> None:
    """In the child: run the call, send every item, stop at the next item once the parent wrote to ``stop``."""
    os.set_blocking(stop, False)
    try:
        args, kwargs = pickle.loads(arguments)
        items = fn(*args, **kwargs)
        for item in items:
            try:
                stopped = bool(os.read(stop, 1))
            except BlockingIOError:
                stopped = False
            if stopped:
                items.close()  # spaces: ``if stop_event.is_set(): gen.close()``
                break
            _send(out, _OK, item)
    except BaseException as error:  # every failure goes back to the parent, as spaces' ExceptionResult
        _send(out, _ERROR, f"{type(error).__name__}: {error}")
    else:
        _send(out, _END, None)


def _duration(duration: Callable[..., int], args: tuple, kwargs: dict) -> int:
    seconds = duration(*args, **kwargs)
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds <= 0:
        raise H3AppError(f"a ZeroGPU call declared {seconds!r} seconds: a positive whole number is needed.")
    return seconds


def forked(fn: Callable[..., Generator[Any, None, None]],
           duration: Callable[..., int]) -> Callable[..., Generator[Any, None, None]]:
    """``fn`` (a generator function) run in a fresh forked child per call."""

    def call(*args: Any, **kwargs: Any) -> Generator[Any, None, None]:
        asked.append(_duration(duration, args, kwargs))
        arguments = pickle.dumps((args, kwargs))  # what spaces sends the child: it must pickle
        out_read, out_write = os.pipe()
        stop_read, stop_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: run, report, and leave without running the parent's clean-ups
            os.close(out_read)
            os.close(stop_write)
            code = 0
            try:
                _child(fn, arguments, out_write, stop_read)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
        os.close(out_write)
        os.close(stop_read)
        return _parent(pid, out_read, stop_write)

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


def _parent(pid: int, out: int, stop: int) -> Generator[Any, None, None]:
    """Yield the child's items; closing this generator stops the child (killed after :data:`STOP_SECONDS`)."""
    finished = False
    try:
        while True:
            message = _receive(out)
            if message is None:
                raise H3AppError("the ZeroGPU stand-in's child ended without an answer (GPU task aborted).")
            tag, value = message
            if tag == _END:
                finished = True
                return
            if tag == _ERROR:
                finished = True
                raise H3AppError(f"ZeroGPU worker error: {value}")
            yield value
    finally:
        if not finished:
            try:
                os.write(stop, b"x")
            except OSError:
                pass
        _reap(pid, finished)
        os.close(out)
        os.close(stop)


def _reap(pid: int, finished: bool) -> None:
    """Wait for the child; one that was stopped and has not ended after :data:`STOP_SECONDS` is killed."""
    deadline = time.monotonic() + (STOP_SECONDS if not finished else 60.0)
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
