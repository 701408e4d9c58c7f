"""Rehearsals shared by several modules (a plugin: tests/conftest.py lists it in ``pytest_plugins``).

A rehearsal on fake CUDA costs seconds even on the tiny checkpoint, and ``planner.measure`` keeps one per adapter
*object*: two modules that each build the same adapter header rehearse twice. ``tiny_rank4_measured`` builds it
once for the session (the plan's speed fields, tests/test_hardware_speed.py, and bench/gpu_speed's predictions,
tests/test_bench_gpu_speed.py). ``full_size_t2va_previewed`` is the one full-size t2va request at 544p (with step
previews: the request itself runs as without them) that tests/test_rehearsal_full_size.py and
tests/test_preview_cost.py both read: about a minute on 2 cores, paid once."""

from __future__ import annotations

from typing import Any

import pytest


def tiny_lightx2v_options(rank: int) -> Any:
    """``RehearsalOptions`` of the default tiny request with a LightX2V-shaped rank-``rank`` adapter (alpha 2, bf16)."""
    import torch

    from h3app.hardware.header_adapter import lightx2v_header
    from h3app.hardware.rehearsal import RehearsalOptions
    from h3app.model import repo
    from h3app.rules.h3_modules import transformer_shapes

    header = lightx2v_header(transformer_shapes(repo.read_transformer_config(repo.TINY)), rank=rank,
                             dtype=torch.bfloat16, alpha=2.0)
    return RehearsalOptions(adapter=header)


@pytest.fixture(scope="session")
def full_size_t2va_previewed() -> Any:
    """``planner.measure`` of the full model's t2va request at 544p, no LoRA, a step preview after every evaluation."""
    from h3app.hardware.planner import measure
    from h3app.hardware.rehearsal import RehearsalOptions

    return measure(RehearsalOptions(workflow="t2va", resolution="544p", preview=True))


@pytest.fixture(scope="session")
def tiny_rank4_options() -> Any:
    """The rank-4 options whose adapter object ``tiny_rank4_measured`` was measured with (``measure`` keys on it)."""
    return tiny_lightx2v_options(4)


@pytest.fixture(scope="session")
def tiny_rank4_measured(tiny_rank4_options: Any) -> Any:
    """``planner.measure`` of the tiny checkpoint with a rank-4 LightX2V-shaped adapter, once per session."""
    from h3app.hardware.planner import measure
    from h3app.model import repo

    return measure(tiny_rank4_options, repo.TINY)
