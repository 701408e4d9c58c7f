"""The parsers of the advanced strengths (h3app/rules: no torch): schedules, block ranges, modality factors; one
line for every bad value, canonical labels that parse back to the same value."""

from __future__ import annotations

import math

import pytest

from h3app.errors import H3AppError
from h3app.rules.blocks import block_index, parse_block_strength
from h3app.rules.modality import ModalityStrength
from h3app.rules.schedule import parse_schedule
from h3app.settings import LoRASettings


def test_a_list_gives_one_factor_per_evaluation_and_refuses_another_length():
    schedule = parse_schedule("1, 1;0.5 0.5")
    assert schedule.per_evaluation(4) == (1.0, 1.0, 0.5, 0.5)
    assert schedule.label == "1,1,0.5,0.5" and parse_schedule(schedule.label) == schedule
    with pytest.raises(H3AppError) as refused:
        schedule.per_evaluation(8)
    message = str(refused.value)
    assert "4 values" in message and "8 evaluations" in message and "\n" not in message


@pytest.mark.parametrize("count", [1, 2, 5, 9])
def test_curves_follow_their_formula(count):
    fractions = [i / (count - 1) if count > 1 else 0.0 for i in range(count)]
    linear = parse_schedule("linear:1:0.5").per_evaluation(count)
    assert linear == pytest.approx([1 - 0.5 * p for p in fractions], abs=1e-15)
    cosine = parse_schedule("cosine:1:0").per_evaluation(count)
    assert cosine == pytest.approx([1 - (1 - math.cos(math.pi * p)) / 2 for p in fractions], abs=1e-15)
    windowed = parse_schedule("constant:0.5@0-0.5").per_evaluation(count)
    assert windowed == tuple(0.5 if p <= 0.5 else 0.0 for p in fractions)


def test_a_window_runs_the_curve_inside_and_switches_the_adapter_off_outside():
    schedule = parse_schedule("LINEAR:2:0 @ 0.25-0.75")
    assert schedule.label == "linear:2:0@0.25-0.75"
    assert schedule.per_evaluation(5) == pytest.approx((0.0, 2.0, 1.0, 0.0, 0.0))
    assert schedule.at(0.25) == 2.0 and schedule.at(0.2) == 0.0 and schedule.at(0.8) == 0.0


@pytest.mark.parametrize("text, words", [
    ("wiggle:1:0", "unknown curve"),
    ("linear:1", "a start and an end value"),
    ("constant:1:2", "one value"),
    ("linear:1:0.5@0.8-0.2", "0 ≤ FROM ≤ TO ≤ 1"),
    ("linear:1:0.5@0.5", "FROM-TO"),
    ("1,nan,1", "finite"),
    ("1,200", "between -100 and 100"),
    (",".join(["1"] * 1001), "more than the 1000"),
])
def test_bad_schedules_are_one_line(text, words):
    with pytest.raises(H3AppError) as refused:
        parse_schedule(text)
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_empty_means_no_schedule():
    assert parse_schedule("") is None and parse_schedule("  ") is None and parse_schedule(None) is None


def test_block_ranges_parse_sort_and_print_back():
    blocks = parse_block_strength("40-49:1.2; 0-9:0.5, 12:0")
    assert blocks.ranges == ((0, 9, 0.5), (12, 12, 0.0), (40, 49, 1.2))
    assert blocks.label == "0-9:0.5,12:0,40-49:1.2" and parse_block_strength(blocks.label) == blocks
    assert [blocks.factor(i) for i in (0, 9, 10, 12, 45, 50, None)] == [0.5, 0.5, 1.0, 0.0, 1.2, 1.0, 1.0]
    assert blocks.factor_of("transformer_blocks.41.ff.net.2") == 1.2
    assert blocks.factor_of("token_refiner.refiner_blocks.0.attn.to_q") == 1.0
    assert block_index("transformer_blocks.7.adaln_proj.linear") == 7 and block_index("proj_out") is None
    with pytest.raises(H3AppError, match="names block 49, but this model has 2 blocks"):
        blocks.check_blocks(2)


@pytest.mark.parametrize("text, words", [
    ("0-9:0.5,5-12:1", "block 5 is in two ranges"),
    ("9-0:0.5", "runs backwards"),
    ("0-9", "FIRST-LAST:FACTOR"),
    ("a:1", "FIRST-LAST:FACTOR"),
    ("0-9:x", "must be a number"),
])
def test_bad_block_ranges_are_one_line(text, words):
    with pytest.raises(H3AppError) as refused:
        parse_block_strength(text)
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_settings_keep_the_canonical_spellings_and_check_the_factors():
    settings = LoRASettings(source="x", audio_strength="0", strength_schedule="cosine:1:0.5@0-1",
                            block_strength="3:2")
    assert settings.strength_schedule.label == "cosine:1:0.5" and settings.block_strength.label == "3:2"
    assert settings.modality == ModalityStrength(1.0, 1.0, 0.0) and not settings.modality.is_unit
    assert settings.modality.label == "video 1, text 1, audio 0"
    with pytest.raises(H3AppError, match="audio strength must be finite"):
        LoRASettings(source="x", audio_strength=float("inf"))
