"""The plan's numbers at full size (one real rehearsal each, on fake CUDA): the goals of right-sizing H3 for the
boxes people rent, the README's suggested hardware and GPU command, and the docs/hardware.md table."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from h3app.hardware import table
from h3app.hardware.flavors import BY_NAME, GB
from h3app.hardware.planner import Placement, make_plan, measure

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lora_request_plans():
    """t2va, 544p, 5 s, bf16, a 312-target rank-128 adapter unmerged: each placement the runtime offers."""
    return {plan.placement: plan for plan in table.plans(128)}


def test_an_h200_holds_everything_resident_in_bf16_within_138_gb(lora_request_plans):
    plan = lora_request_plans[Placement("none")]
    assert plan.peak_gpu_bytes <= 138 * GB and plan.fits["h200"]


@pytest.mark.parametrize("card", ["rtx-pro-6000", "zero-gpu-xlarge"])
def test_a_96_gb_card_holds_everything_resident_with_fp8(lora_request_plans, card):
    assert lora_request_plans[Placement("none", fp8=True, fp8_text_encoder=True)].fits[card]


def test_a100_large_has_a_placement_within_80_gb_of_gpu_and_142_gb_of_host(lora_request_plans):
    fitting = [p for p, plan in lora_request_plans.items() if plan.fits["a100-large"]]
    assert fitting
    row = next(r for r in lora_request_plans[fitting[0]].flavors if r["name"] == "a100-large")
    assert row["fits_gpu"] and row["fits_host"]


def test_the_docs_table_is_the_plans_own(lora_request_plans):
    docs = (ROOT / "docs" / "hardware.md").read_text()
    assert table.markdown(list(lora_request_plans.values())) in docs


def _default_plan(argv: list[str]):
    """``python -m h3app plan ARGV`` (the default request: full, t2va, 544p, 5 s, bf16, no adapter) as the command
    builds it, on one shared measurement."""
    from h3app.cli import build_parser
    from h3app.commands.plan import plan_options

    options, placement = plan_options(build_parser().parse_args(["plan", *argv]))
    return options, placement


def test_the_readme_suggests_what_the_plan_recommends_and_its_gpu_command_fits(rehearsed, monkeypatch):
    import app
    from h3app.hardware import planner

    monkeypatch.setattr(planner, "rehearse", rehearsed)  # the default request's rehearsal, once in the session

    readme = (ROOT / "README.md").read_text()
    suggested = re.search(r"^suggested_hardware:\s*(\S+)", readme.split("---")[1], re.M).group(1)
    options, placement = _default_plan([])
    measured = measure(options)
    plan = make_plan(options, placement, measured=measured)
    assert suggested == plan.recommended["space_hardware"]
    command = re.search(r"^(?:HF_TOKEN=\S+ )?python app\.py (.+)$", readme.split("## Real weights on a GPU box")[1],
                        re.M).group(1)
    args = app.build_parser().parse_args(shlex.split(command))
    assert args.device == "cuda" and args.dtype == "bfloat16"
    flags = Placement(args.offload, fp8=args.fp8, fp8_text_encoder=args.fp8_text_encoder).label
    options, placement = _default_plan(shlex.split(flags))
    assert make_plan(options, placement, measured=measured).fits[suggested]
    assert BY_NAME[suggested].space_hardware == suggested
