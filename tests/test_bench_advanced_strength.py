"""bench P7's pieces: the op counter counts what a GPU kernel would read, write and compute on fake CUDA; one
full-width block counted per variant (the advanced strengths add kernels and, with a schedule, host copies)."""

from __future__ import annotations

import pytest
import torch

from bench.context import BenchContext
from bench.p7_advanced_strength import LAUNCH_S, count_full_size, op_counter, predicted_seconds
from h3app.hardware.fake_cuda import fake_cuda


def test_the_op_counter_counts_flops_bytes_and_host_copies():
    with fake_cuda():
        a = torch.ones(64, 32, device="cuda")
        b = torch.ones(32, 16, device="cuda")
        scale = torch.empty((), device="cuda")
        ops = op_counter()
        with ops:
            c = a @ b
            c.t()  # a view moves nothing
            scale.copy_(torch.tensor(2.0))
    assert ops.kernels == [(2 * 64 * 32 * 16, (64 * 32 + 32 * 16 + 64 * 16) * 4, "float32")]
    assert ops.copies == [4]
    predicted = predicted_seconds(ops)
    assert predicted["kernels"] == 1 and predicted["copies"] == 1
    assert predicted["seconds"] > LAUNCH_S + predicted["copy_s"] > LAUNCH_S


@pytest.mark.slow
def test_one_full_width_block_per_variant(tmp_path):
    ctx = BenchContext.create(quick=True, cache_dir=tmp_path, log=lambda message: None)
    counted = count_full_size(ctx, num_layers=1)
    plain, modality, scheduled = counted["plain"], counted["modality"], counted["scheduled"]
    assert modality["kernels"] > plain["kernels"] and modality["copies"] == plain["copies"] == 0
    assert scheduled["copies"] > 0  # the schedule's refill of the scale tensors
    assert plain["seconds"] < modality["seconds"] < 1.03 * plain["seconds"]
