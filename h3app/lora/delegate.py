"""Attributes read through to a member: an object that shows some of its member's attributes as its own."""

from __future__ import annotations

from typing import Any


def read_through(member: str, name: str) -> property:
    """A read-only property whose value is ``self.<member>.<name>``."""

    def read(self: Any) -> Any:
        return getattr(getattr(self, member), name)

    return property(read, doc=f"``{member}.{name}``.")
