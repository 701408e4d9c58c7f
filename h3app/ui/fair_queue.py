"""The fair queue of a hosted app: who a visitor is, and GPU events admitted (or refused) before they wait.

In hosted mode every GPU event (load, generate, check, grid — UI and API) runs inside
``backend.admission.hold(visitor)``: at most ``PER_VISITOR`` per visitor and ``MAX_PENDING`` in all wait or run;
more are refused at once with one line. Gradio's own queue must never hold the surplus (its ``max_size`` counts
every waiting event, cheap ones included), so the GPU events get ``MAX_PENDING + REFUSAL_SLOTS`` concurrent slots:
the admitted ones wait inside their handler for the backend's single worker, and a few slots stay free so that a
refusal is answered in milliseconds. Cheap events run off the queue or under their own concurrency ids.

A visitor is its Gradio session, and in hosted mode also its client address: one address opening many sessions
still gets ``PER_VISITOR`` jobs. On a Space (``SPACE_ID`` set) the address is the last ``X-Forwarded-For`` entry (the
one Hugging Face's proxy appended; a client can only add entries before it). Elsewhere it is the peer as the server
(uvicorn) reports it, which follows ``X-Forwarded-For`` only from the proxies in ``FORWARDED_ALLOW_IPS`` (default:
loopback): a client that connects directly cannot forge its address, and unless ``FORWARDED_ALLOW_IPS`` is set an
address taken from that header counts as unknown. Every visitor whose address is unknown (a loopback peer) shares
one address key, so new session hashes buy no new share. Local mode keeps one
GPU slot and Gradio's queue bounded by the backend's (no visitors to tell apart).
"""

from __future__ import annotations

import functools
import inspect
import ipaddress
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gradio as gr

from ..backend.admission import OWNER, Refused
from .session import session_key

if TYPE_CHECKING:
    from ..backend.service import Backend

REFUSAL_SLOTS = 4
GPU_CONCURRENCY_ID = "gpu"
UNKNOWN_ADDRESS = "unknown"  # every visitor whose address is not known shares one share
HOSTED_QUEUE_SIZE = 64  # Gradio's queue: cheap events waiting for their own slots (GPU events do not wait there)


def gpu_events(backend: Backend) -> dict[str, Any]:
    """Event keyword arguments of a GPU event on ``backend``'s app."""
    limit = backend.admission.max_pending + REFUSAL_SLOTS if backend.hosted else 1
    return {"concurrency_id": GPU_CONCURRENCY_ID, "concurrency_limit": limit}


def queue_size(backend: Backend) -> int:
    """Gradio's ``max_size`` for ``backend``'s app."""
    return HOSTED_QUEUE_SIZE if backend.hosted else backend.worker.max_queue


def client_address(request: Any) -> str | None:
    """The visitor's address (see the module docstring); None for a loopback peer, and for an address uvicorn took
    from ``X-Forwarded-For`` when no proxy was configured (``FORWARDED_ALLOW_IPS`` unset: uvicorn then trusts any
    loopback peer's header, so a local client could choose its address)."""
    headers = getattr(request, "headers", None) or {}
    forwarded = [p.strip() for p in str(headers.get("x-forwarded-for", "") or "").split(",") if p.strip()]
    if os.environ.get("SPACE_ID") and forwarded:
        return forwarded[-1][:64]
    host = getattr(getattr(request, "client", None), "host", None)
    if not host or ("FORWARDED_ALLOW_IPS" not in os.environ and host in map(_host_of, forwarded)):
        return None
    try:
        return None if ipaddress.ip_address(host).is_loopback else host
    except ValueError:
        return None if host in ("localhost", "testclient") else host[:64]


def _host_of(entry: str) -> str:
    """``203.0.113.5``, ``203.0.113.5:80``, ``[2001:db8::1]:80`` → the host part."""
    if entry.startswith("["):
        return entry[1:].split("]")[0]
    return entry.rsplit(":", 1)[0] if entry.count(":") == 1 else entry


def visitor_keys(request: Any) -> list[str]:
    """The keys one visitor's jobs are counted under: its session and its address — visitors whose address is not
    known all under one address key, so that new session hashes never buy new shares."""
    return [f"session {session_key(request)}", f"address {client_address(request) or UNKNOWN_ADDRESS}"]


def admitted(fn: Callable[..., Any], backend: Backend) -> Callable[..., Any]:
    """``fn`` (a GPU event taking a ``gr.Request`` argument) held in ``backend``'s admission in hosted mode;
    unchanged in local mode. A refusal is one ``gr.Error`` line, before anything waits."""
    if not backend.hosted:
        return fn

    def acquire(args: tuple, kwargs: dict) -> list[str]:
        request = next((v for v in (*args, *kwargs.values()) if isinstance(v, gr.Request)), None)
        keys = visitor_keys(request)
        try:
            backend.admission.acquire(keys)
        except Refused as error:
            raise gr.Error(str(error), print_exception=False) from None
        OWNER.set(keys[-1])  # the worker serves visitors (their share: the address key) round-robin
        return keys

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stream(*args: Any, **kwargs: Any) -> Any:
            keys = acquire(args, kwargs)
            try:
                yield from fn(*args, **kwargs)
            finally:
                backend.admission.release(keys)
        return stream

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        keys = acquire(args, kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            backend.admission.release(keys)
    return call
