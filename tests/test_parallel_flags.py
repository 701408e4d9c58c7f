"""Context-parallel flags and guards that need no second process: validation, torchrun mismatches, the CPU shim
(in the diffusers door), the plan check, and the 2-GPU bench section's refusal without GPUs."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from h3app import cli
from h3app.errors import H3AppError
from h3app.model.diffusers_compat import one_device_without_accelerator
from h3app.parallel.context_parallel import parallelize
from h3app.parallel.launch import start_ranks
from h3app.parallel.topology import ParallelSpec, add_parallel_arguments, spec_from_args


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parallel_arguments(parser)
    parser.add_argument("--device", default="cpu")
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("fields, words", [
    ({"ulysses": 0}, "--ulysses must be a whole number"),
    ({"ring": -2}, "--ring must be a whole number"),
    ({"ulysses": 2, "ring": 2}, "not both"),
    ({"ulysses": 2, "timeout_s": 0.0}, "--parallel-timeout must be a positive"),
])
def test_bad_topologies_are_one_line(fields, words):
    with pytest.raises(H3AppError, match=words) as caught:
        ParallelSpec(**fields)
    assert "\n" not in str(caught.value)


def test_flags_parse_into_a_spec():
    spec = spec_from_args(_args("--ulysses", "4", "--parallel-timeout", "30"))
    assert (spec.world_size, spec.label, spec.timeout_s, spec.enabled) == (4, "ulysses 4", 30.0, True)
    assert not spec_from_args(_args()).enabled


def test_one_rank_starts_nothing(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert start_ranks(_args()) is None


@pytest.mark.parametrize("world, argv, words", [
    ("2", (), "add --ulysses 2"),
    ("4", ("--ulysses", "2"), "torchrun started 4 ranks but --ulysses × --ring is 2"),
])
def test_torchrun_world_size_must_match_the_flags(monkeypatch, world, argv, words):
    monkeypatch.setenv("WORLD_SIZE", world)
    with pytest.raises(H3AppError, match=words):
        start_ranks(_args(*argv))


def test_ring_is_refused_on_cpu_before_any_rank_starts(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(H3AppError, match="--ring needs an attention backend"):
        start_ranks(_args("--ring", "2"))


def test_generate_with_a_bad_degree_exits_2_with_one_line(capsys, tmp_path):
    code = cli.main(["generate", "--prompt", "x", "--out", str(tmp_path / "x.mp4"), "--ulysses", "0"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--ulysses must be a whole number" in err


@pytest.mark.skipif(torch.accelerator.device_count() > 0, reason="the shim acts only without an accelerator")
def test_cpu_shim_reads_one_device_inside_only():
    assert torch.accelerator.device_count() == 0
    with one_device_without_accelerator():
        assert torch.accelerator.device_count() == 1
    assert torch.accelerator.device_count() == 0


def test_a_model_without_a_known_plan_is_refused():
    class NoPlan(torch.nn.Module):
        _cp_plan = None

    with pytest.raises(H3AppError, match="no context-parallel plan"):
        parallelize(NoPlan(), ParallelSpec(ulysses=2))


def test_two_gpu_bench_section_says_why_it_skipped():
    from bench.gpu_parallel import two_gpu_rows

    if torch.cuda.device_count() >= 2:
        pytest.skip("two GPUs present: the section runs for real in bench/gpu.py")
    (what, _, seconds, note), = two_gpu_rows()
    assert math.isnan(seconds) and note.startswith("skipped: needs 2 CUDA GPUs")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_ranks_without_a_gpu_are_refused_before_any_rank_starts(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = _args("--ulysses", "2", "--device", "cuda")
    with pytest.raises(H3AppError, match="no usable CUDA GPU") as caught:
        start_ranks(args)
    assert "use --device cpu" in str(caught.value)
