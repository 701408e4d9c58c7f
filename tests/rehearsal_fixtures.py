"""Full-size rehearsals shared by the session (a plugin: tests/conftest.py lists it in ``pytest_plugins``).

A full-size rehearsal (h3app/hardware/rehearsal.py: the 33B transformer and the 32B conditioner on fake CUDA) takes
tens of seconds; several modules ask for the same request (t2va, 544p, 5 s, bf16, no adapter: the rehearsal tests
and the plan's defaults), so ``rehearsed`` runs each adapter-free request once. A request with an adapter is run
every time (its header is not hashable, and no two modules ask for the same one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture(scope="session")
def rehearsed() -> Callable[[Any], Any]:
    """``rehearse(options)`` of h3app.hardware.rehearsal, run once per adapter-free ``options`` in the session."""
    from h3app.hardware.rehearsal import rehearse

    done: dict[Any, Any] = {}

    def run(options: Any, **kwargs: Any) -> Any:
        if options.adapter is not None or kwargs:
            return rehearse(options, **kwargs)
        if options not in done:
            done[options] = rehearse(options)
        return done[options]

    return run
