"""The app plans before downloading: a real model on a GPU too small stops with one line naming what fits (the
judge's verdict on the app's default request; measurements here are fixtures)."""

from __future__ import annotations

import pytest
import torch
from test_hardware_plan import _measured

from h3app.errors import H3AppError
from h3app.hardware import judge, preflight
from h3app.hardware.flavors import GB
from h3app.model.loader import LoadOptions


def _gpu_options(**fields):
    """LoadOptions for a CUDA device this CPU machine does not have (LoadOptions itself refuses it here)."""
    offload = fields.pop("offload", "none")  # offload needs CUDA: LoadOptions refuses it on this CPU machine
    options = LoadOptions(dtype=torch.bfloat16, **fields)
    object.__setattr__(options, "device", "cuda")
    object.__setattr__(options, "offload", offload)
    return options


def test_tiny_and_cpu_runs_are_not_planned():
    assert preflight.check_before_download("tiny", _gpu_options(), device=("H100", 80 * GB)) is None
    assert preflight.check_before_download("MiniMaxAI/MiniMax-H3", LoadOptions(), device=None) is None


def test_a_real_model_on_a_gpu_without_cuda_is_refused():
    with pytest.raises(H3AppError, match="no CUDA GPU"):
        preflight.check_before_download("MiniMaxAI/MiniMax-H3", _gpu_options(), device=None)


def test_too_small_a_gpu_stops_before_downloading_and_names_what_fits(monkeypatch):
    monkeypatch.setattr(judge, "measured_for", lambda *a, **k: _measured())
    options = _gpu_options()  # offload none: ~140 GiB resident in the fixture
    with pytest.raises(H3AppError) as caught:
        preflight.check_before_download("MiniMaxAI/MiniMax-H3", options, device=("NVIDIA H100", 80 * GB),
                                        host=256 * GB)
    message = str(caught.value)
    assert "\n" not in message and "--offload auto" in message and "nothing was downloaded" in message
    fitting = preflight.check_before_download("MiniMaxAI/MiniMax-H3", _gpu_options(offload="auto"),
                                              device=("NVIDIA H100", 80 * GB), host=256 * GB)
    assert fitting is not None and fitting.fits and fitting.peak_gpu_bytes < 80 * GB
    assert fitting.request == judge.default_request()  # the app's default request: the published one


def test_a_box_short_of_host_ram_for_offload_stops_before_downloading_and_names_what_fits(monkeypatch):
    monkeypatch.setattr(judge, "measured_for", lambda *a, **k: _measured())
    with pytest.raises(H3AppError) as caught:  # offload keeps ~130 GB of weights in host RAM; this box has 96 GB
        preflight.check_before_download("MiniMaxAI/MiniMax-H3", _gpu_options(offload="auto"),
                                        device=("NVIDIA RTX PRO 6000", 96 * GB), host=96 * GB)
    message = str(caught.value)
    assert "\n" not in message and "of host RAM" in message and "nothing was downloaded" in message
    assert "--offload none --fp8 --fp8-text-encoder" in message  # resident: the host holds one component at a time
    assert preflight.host_ram() is None or preflight.host_ram() > 0


def test_the_check_judges_every_rank_and_its_host_copy(monkeypatch):
    """Context parallel: each rank holds the whole model and its own host copy, so two ranks need two GPUs' worth of
    weights and twice the host RAM."""
    monkeypatch.setattr(judge, "measured_for", lambda *a, **k: _measured())
    options = _gpu_options(offload="auto")
    one = preflight.check_before_download("MiniMaxAI/MiniMax-H3", options, device=("NVIDIA H100", 80 * GB),
                                          host=512 * GB)
    two = preflight.check_before_download("MiniMaxAI/MiniMax-H3", options, device=("NVIDIA H100", 80 * GB),
                                          host=512 * GB, ranks=2)
    assert two.box.gpus == 2 and two.host_bytes == 2 * one.host_bytes
    assert two.peak_gpu_bytes < one.peak_gpu_bytes  # half the step's activations per rank
    with pytest.raises(H3AppError, match="of host RAM"):
        preflight.check_before_download("MiniMaxAI/MiniMax-H3", options, device=("NVIDIA H100", 80 * GB),
                                        host=200 * GB, ranks=2)

