"""A property test that may be refused counts what it accepted: a strategy that drifts so that every example is
refused would otherwise pass while checking nothing (its checks run only on accepted examples)."""

from __future__ import annotations


class Share:
    """Examples seen and accepted by one property test."""

    def __init__(self) -> None:
        self.seen = 0
        self.accepted = 0

    def count(self, accepted: bool) -> bool:
        """Count one example; returns ``accepted`` (``if not share.count(ok): return``)."""
        self.seen += 1
        self.accepted += bool(accepted)
        return accepted

    def assert_at_least(self, fraction: float, what: str) -> None:
        """At least ``fraction`` of the examples were accepted (and there were examples)."""
        assert self.seen, f"no examples of {what} ran"
        assert self.accepted >= fraction * self.seen, (
            f"only {self.accepted} of {self.seen} {what} were accepted (expected at least {fraction:.0%}): the "
            f"strategy no longer reaches the accepted cases the property checks")
