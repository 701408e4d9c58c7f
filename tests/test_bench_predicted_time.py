"""bench/predicted_time.py: the predicted-time rows' pieces — a goal that fails both ways, and evaluation seconds
taken from the progress calls without the final decode. No timing asserts."""

from __future__ import annotations

import pytest

from bench.predicted_time import WITHIN_TWO, evaluation_seconds
from bench.table import Goal, Row


def test_a_prediction_is_held_within_two_times_either_way():
    assert WITHIN_TWO.met(1.0, 1.5) is True and WITHIN_TWO.met(1.0, 0.5) is True
    assert WITHIN_TWO.met(1.0, 2.5) is False  # predicted too high
    assert WITHIN_TWO.met(1.0, 0.06) is False  # predicted too low: what a ratio cap alone would pass
    assert WITHIN_TWO.met(1.0, None) is None
    assert Goal("≥ 1×", min_ratio=1.0).met(9.0, 3.0) is True  # a floor alone
    row = Row("P6", "predicted ÷ measured", 0.06, "measured", 1.2, WITHIN_TWO)
    assert row.ratio == pytest.approx(0.05) and row.met is False


def test_evaluation_seconds_are_the_gaps_between_progress_calls_less_the_last():
    stamps = [10.0, 10.5, 10.75, 11.0, 14.0]  # before each of 4 evaluations, then at the end (after the decodes)
    assert evaluation_seconds(stamps) == pytest.approx([0.5, 0.25, 0.25])
    assert evaluation_seconds([1.0, 2.0]) == []  # one evaluation: its gap holds the decodes too
