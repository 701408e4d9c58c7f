"""The plan at full size (real rehearsals on fake CUDA) held to what the project says: the README's suggested
hardware is the recommendation, whose options pass ``plan --hardware`` and the app's start-up check at the default
request and at its longest clip; docs/hardware.md's table is the plan's; the issue's goals per card.

One rehearsal of the default request (shared with tests/test_hardware_auto.py in one process) and one of the
longest clip (the recommendation's limit search)."""

from __future__ import annotations

import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from h3app.hardware import table
from h3app.hardware.flavors import BY_NAME, GB
from h3app.hardware.judge import default_request, judge
from h3app.hardware.planner import Placement

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the first test builds the full plan with its limits
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def default_plan():
    """``python -m h3app plan`` without flags: the default request, every flavor, the recommendation's limits."""
    return table.default_plan(with_limits=True)


def test_the_default_request_is_the_published_one(default_plan):
    request = default_plan.request
    assert (request["width"], request["height"], request["frames"]) == (1344, 768, 124)
    assert request["workflow"] == "t2va" and request["steps"] >= 20


def test_an_h200_holds_everything_resident_in_bf16_within_138_gb(default_plan):
    verdict = judge(default_request(), Placement("none"), BY_NAME["h200"])
    assert verdict.peak_gpu_bytes <= 138 * GB and verdict.fits
    assert next(r for r in default_plan.flavors if r["name"] == "h200")["best"]["placement"] == "--offload none"


@pytest.mark.parametrize("card", ["rtx-pro-6000", "zero-gpu-xlarge"])
def test_a_96_gb_card_holds_everything_resident_with_fp8(card):
    assert judge(default_request(), Placement("none", fp8=True, fp8_text_encoder=True), BY_NAME[card]).fits


def test_a_box_where_nothing_fits_has_no_best_and_no_price(default_plan):
    for row in default_plan.flavors:
        if row["name"] in ("t4-small", "l4x1", "l40sx1"):
            assert row["best"] is None and row["name"] not in default_plan.predicted
            assert default_plan.left_out[row["name"]] == "no placement fits its GPU and host RAM"


def test_the_recommendation_passes_plan_hardware_and_the_start_up_check_at_its_limits(default_plan):
    """The issue's check: ``recommended.options`` fit ``plan --hardware <recommended>``, and the app's own start-up
    check accepts them at the default request and at ``limits.max_duration_s``."""
    from test_hardware_auto import _gpu_options

    import app
    from h3app.cli import build_parser
    from h3app.commands.plan import plan_options
    from h3app.hardware import preflight
    from h3app.hardware.recommend import make_plan

    r = default_plan.recommended
    box = BY_NAME[r["hardware"]]
    held = r["limits"]
    assert held["width"] * held["height"] == held["max_pixels"] == 1344 * 768
    assert held["max_frames"] >= 124 and held["max_duration_s"] == pytest.approx(held["max_frames"] / 24)
    request, placement, setup = plan_options(build_parser().parse_args(
        ["plan", "--hardware", r["hardware"], *shlex.split(r["options"])]))
    assert make_plan(request, placement, setup, hardware=r["hardware"], with_limits=False).fits[r["hardware"]]
    args = app.build_parser().parse_args(shlex.split(r["options"]))
    serving = app.serving_of(args)
    for frames in (request.frames, held["max_frames"]):
        verdict = preflight.check_before_download("MiniMaxAI/MiniMax-H3", _gpu_options(serving),
                                                  device=(box.gpu, box.gpu_bytes), host=box.host_bytes,
                                                  ranks=r["ranks"], request=replace(request, frames=frames))
        assert verdict is not None and verdict.fits, frames
    if held["max_frames"] < 345:  # the next clip length does not fit: the limit is the longest
        assert not judge(replace(request, frames=held["max_frames"] + 17), placement, box).fits


def test_the_readme_suggests_the_recommendation_and_says_nothing_else_is_needed(default_plan):
    readme = (ROOT / "README.md").read_text()
    suggested = re.search(r"^suggested_hardware:\s*(\S+)", readme.split("---")[1], re.M).group(1)
    assert suggested == default_plan.recommended["space_hardware"] == default_plan.recommended["hardware"]
    section = readme.split("## Real weights on a GPU box")[1].split("\n## ")[0]
    assert f"`{suggested}`" in section and "nothing else to set" in section
    command = re.search(r"^python -m h3app plan .*--hardware \S+.*$", section, re.M)
    assert command is not None  # the one-line plan command for other boxes


def test_the_docs_table_is_the_plans_own(default_plan):
    docs = (ROOT / "docs" / "hardware.md").read_text()
    assert table.markdown(default_plan) in docs
    r = default_plan.recommended
    held = r["limits"]
    label = Placement(r["offload"], fp8=r["fp8"], fp8_text_encoder=r["fp8_text_encoder"], ranks=r["ranks"],
                      ring=r["ring"]).label
    assert f"| `{r['hardware']}` | `{label}` | {held['max_duration_s']:g} s ({held['max_frames']} frames) |" in docs


def test_the_readme_and_the_hardware_docs_print_the_plans_prices(default_plan):
    """One price: the README's price of the recommended box's video is the plan's, and every $ per video that the
    README, hardware.md and performance.md print is one the plan gives for a flavor (``$…/h`` are the flavors'
    published hourly rates)."""
    readme = (ROOT / "README.md").read_text()
    r = default_plan.recommended
    quoted = re.search(r"about \$(\d+\.\d+) for a 5 s video at (\d+)\s+steps", readme)
    assert quoted is not None and quoted.group(1) == f"{r['usd_per_video']:.3f}"
    assert int(quoted.group(2)) == default_plan.request["steps"]
    planned = {f"{row['best']['usd_per_video']:.3f}" for row in default_plan.flavors
               if row["best"] is not None and row["best"]["usd_per_video"] is not None}
    texts = {"README.md": readme, **{name: (ROOT / "docs" / name).read_text()
                                     for name in ("hardware.md", "performance.md")}}
    printed = {(name, price) for name, text in texts.items()
               for price in re.findall(r"\$(\d+\.\d+)(?!\d|/h)", text)}
    assert printed and all(price in planned for _, price in printed), sorted(printed)
