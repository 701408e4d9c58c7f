"""README's ZeroGPU numbers are the plan's (``plan --hardware zero-gpu-xlarge``: the full-size rehearsal of the
default request on the whole RTX Pro 6000, its best placement, and ``hardware.zero_gpu_home.quota``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from h3app.hardware.flavors import flavor
from h3app.hardware.judge import DEFAULT_SETUP, best, default_request
from h3app.hardware.zero_gpu_home import FLAVOR, quota, quota_table

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_zero_gpu_table_is_the_plans():
    request, box = default_request(), flavor(FLAVOR)
    verdict = best(request, box, DEFAULT_SETUP)
    assert verdict is not None and verdict.placement.fp8 and verdict.placement.offload == "none"
    numbers = quota(request, verdict.placement, DEFAULT_SETUP, box)
    canvas = f"{request.width}×{request.height}, {request.frames} frames"
    block = re.search(r"<!-- zerogpu-quota:[^\n]*-->\n(.*?)\n<!-- /zerogpu-quota -->", README.read_text(), re.S)
    assert block is not None, "README's ZeroGPU quota table is missing"
    assert block.group(1) == quota_table(numbers, canvas)
    assert numbers["turbo"]["fits_one_call"] and numbers["turbo"]["per_day"]["pro"] > numbers["turbo"]["per_day"]["free"]
