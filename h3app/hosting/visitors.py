"""Who a visitor of a hosted app is: the keys its jobs and requests are counted under (``admission.py``).

A visitor is its Gradio session, and in hosted mode also its client address: one address opening many sessions
still gets one share. On a Space (``SPACE_ID`` set) the address is the last ``X-Forwarded-For`` entry (the one
Hugging Face's proxy appended; a client can only add entries before it). Elsewhere it is the peer as the server
(uvicorn) reports it, which follows ``X-Forwarded-For`` only from the proxies in ``FORWARDED_ALLOW_IPS`` (default:
loopback): a client that connects directly cannot forge its address, and unless ``FORWARDED_ALLOW_IPS`` is set an
address taken from that header counts as unknown. Every visitor whose address is unknown (a loopback peer) shares
one address key, so new session hashes buy no new share.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any

UNKNOWN_ADDRESS = "unknown"  # every visitor whose address is not known shares one share


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


def session_key(request: Any) -> str:
    """The session hash of a Gradio request (``"local"`` when called outside a server, e.g. in tests)."""
    return getattr(request, "session_hash", None) or "local"


def visitor_keys(request: Any) -> list[str]:
    """The keys one visitor's jobs are counted under: its session (a Gradio request's session hash; ``"local"``
    outside a server) and its address — visitors whose address is not known all under one address key, so that new
    session hashes never buy new shares."""
    return [f"session {session_key(request)}", f"address {client_address(request) or UNKNOWN_ADDRESS}"]
