"""Attributes read through to a member: an object that shows some of its member's attributes as its own."""

from __future__ import annotations

from typing import Any


def read_through(member: str, name: str, doc: str | None = None) -> property:
    """A read-only property whose value is ``self.<member>.<name>`` (``doc``: its docstring)."""

    def read(self: Any) -> Any:
        return getattr(getattr(self, member), name)

    return property(read, doc=doc or f"``{member}.{name}``.")
