"""Long test files first, so the two worker processes of ``scripts/test.sh`` finish together (a plugin:
tests/conftest.py lists it in ``pytest_plugins``).

pytest-xdist's ``--dist loadfile`` hands out whole files, in collection order, to whichever worker is free
(``--no-loadscope-reorder``: xdist's own reorder puts the files with the most tests first, which are the quick ones
here). A long file handed out last runs on one worker while the other waits, so files are moved into tiers by their
estimated seconds, the longest tier first. Within a tier the order stays pytest-randomly's shuffle, so every run
still tries another order of files (and of the tests inside each file).

The estimate comes from the markers every test carries by the suite's rules (tests/conftest.py, rule 5): a browser
test takes about 10 s on 2 cores, another ``slow`` one about 5 s, any other about 0.15 s (``--durations`` of whole
runs, docs/testing.md). Only the order changes; with one process (``-n 0``) the same order runs there.
"""

from __future__ import annotations

import pytest

SECONDS_BY_MARK = (("browser", 10.0), ("slow", 5.0))  # first match wins: a browser test is also slow
QUICK_TEST_S = 0.15
TIER_FLOORS_S = (60.0, 20.0, 5.0)  # a file over 60 s goes in the first tier, over 20 s the second, …


def estimated_seconds(item: pytest.Item) -> float:
    """About how long ``item`` runs on an idle 2-core machine, from its markers."""
    return next((seconds for mark, seconds in SECONDS_BY_MARK if item.get_closest_marker(mark)), QUICK_TEST_S)


def tier(seconds: float) -> int:
    """0 for the longest files, ``len(TIER_FLOORS_S)`` for the quick ones."""
    return next((index for index, floor in enumerate(TIER_FLOORS_S) if seconds >= floor), len(TIER_FLOORS_S))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Runs after pytest-randomly's shuffle (a wrapper that reorders before every plain hook): a stable sort of the
    files by tier keeps the shuffled order inside each tier and each file's tests together, as shuffled."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    ordered = sorted(files.values(), key=lambda tests: tier(sum(map(estimated_seconds, tests))))
    items[:] = [item for tests in ordered for item in tests]
