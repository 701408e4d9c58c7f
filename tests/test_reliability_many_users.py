"""Reliability: many users at once. Eight clients submit jobs with different adapters, alphas, strengths and modes
at the same time; each result's hash equals the same job run alone (no user sees another's sliders). The queue bound
answers clearly when full and the server serves on. Two levels: the backend (threads calling
``Backend.submit_generate``) and the real app over HTTP (``gradio_client`` against ``launch`` on 127.0.0.1).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from app_fixtures import running_app
from polling import wait_until

from h3app.backend.service import Backend
from h3app.backend.worker import QueueFull
from h3app.errors import H3AppError
from h3app.lora.layers import LoRALinear
from h3app.request import GenerationRequest
from h3app.settings import LoRASettings

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = ROOT / "assets" / "adapters"
REQUEST = GenerationRequest(prompt="two cats arguing on a rooftop", seed=5, steps=2)


def a(name: str, **settings: Any) -> LoRASettings:
    return LoRASettings(source=str(ADAPTERS / name), **settings)


# Eight users: different files, alphas, strengths, modes, one with none and one with two adapters.
USERS: list[list[LoRASettings]] = [
    [],
    [a("lightx2v_turbo_no_alpha.safetensors", alpha=8.0)],
    [a("lightx2v_turbo_no_alpha.safetensors", alpha=64.0, strength=0.5)],
    [a("kohya_musubi.safetensors", strength=-0.5)],
    [a("native_comfyui_alpha.safetensors")],
    [a("native_larry_mixed_rank.safetensors", alpha=16.0, mode="merged")],
    [a("peft_diffusers_metadata.safetensors", strength=0.7), a("kohya_musubi.safetensors", alpha=2.0)],
    [a("diffsynth_interleaved.safetensors", alpha=4.0, strength=1.5)],
]


@pytest.fixture(scope="module")
def backend(tiny_model, tmp_path_factory: pytest.TempPathFactory) -> Backend:
    assert not any(isinstance(m, LoRALinear) for m in tiny_model.transformer().modules())
    service = Backend(loaded=tiny_model, output_dir=tmp_path_factory.mktemp("many_users"))
    yield service
    service.binder.reset()
    service.close()


@pytest.fixture(scope="module")
def solo_hashes(backend: Backend) -> list[str]:
    """Each user's job run alone, one after the other."""
    hashes = [backend.generate(REQUEST, adapters).result.hash for adapters in USERS]
    assert len(set(hashes)) == len(USERS), "the eight settings must give eight different results"
    return hashes


@pytest.mark.slow
def test_eight_concurrent_users_each_get_their_own_result(backend: Backend, solo_hashes: list[str]) -> None:
    start = threading.Barrier(len(USERS))

    def user(index: int) -> str:
        start.wait()  # all eight submit at once
        handle = backend.submit_generate(REQUEST, USERS[index])
        return handle.result(timeout=600).result.hash

    with ThreadPoolExecutor(len(USERS)) as pool:
        concurrent = list(pool.map(user, range(len(USERS))))
    assert concurrent == solo_hashes
    # and in the reverse order, each user submitting twice in a row (interleaved with the others)
    with ThreadPoolExecutor(len(USERS)) as pool:
        handles = list(pool.map(lambda i: [backend.submit_generate(REQUEST, USERS[i]) for _ in range(2)],
                                reversed(range(len(USERS)))))
    again = [[h.result(timeout=600).result.hash for h in pair] for pair in handles]
    assert again == [[solo_hashes[i]] * 2 for i in reversed(range(len(USERS)))]


@pytest.mark.slow
def test_the_queue_bound_answers_clearly_when_full_and_serves_on(tiny_model, tmp_path: Path) -> None:
    service = Backend(loaded=tiny_model, output_dir=tmp_path, max_queue=3)
    release = threading.Event()
    try:
        blocker = service.worker.submit(lambda ctx: release.wait(60), label="a long job")
        wait_until(lambda: blocker.progress.phase == "running", "the blocker to run", wait=blocker.wait_for_change)
        waiting = [service.submit_generate(REQUEST, USERS[i]) for i in (1, 3, 0)]
        assert [h.progress.position for h in waiting] == [1, 2, 3]
        with pytest.raises(QueueFull) as caught:
            service.submit_generate(REQUEST, USERS[2])
        assert isinstance(caught.value, H3AppError)
        message = str(caught.value)
        assert message == "the queue is full (3 jobs waiting): try again in a minute."
        with pytest.raises(QueueFull):
            service.submit_load(USERS[1][0])
    finally:
        release.set()
    blocker.result(timeout=60)
    for handle in waiting:
        assert handle.result(timeout=600).result.frames > 0
    # room again: the refused user's retry is served
    assert service.generate(REQUEST, USERS[2]).result.frames > 0
    service.binder.reset()
    service.close()
    assert not any(isinstance(m, LoRALinear) for m in tiny_model.transformer().modules())


# ---------------------------------------------------------------------------------------------- over HTTP
def _settings_json(adapters: list[LoRASettings]) -> str:
    return json.dumps([{"source": s.source, "weight_name": s.weight_name, "revision": s.revision, "alpha": s.alpha,
                        "strength": s.strength, "mode": s.mode} for s in adapters])


@pytest.fixture(scope="module")
def app_url(backend: Backend, solo_hashes: list[str]) -> str:
    """The real app (build_app + launch) on 127.0.0.1, on the same backend."""
    with running_app(backend, max_file_size=None) as url:
        yield url


def _generate_endpoint(client: Any) -> dict[str, Any]:
    info = client.view_api(print_info=False, return_format="dict")
    endpoints = info["named_endpoints"]
    assert "/generate" in endpoints, sorted(endpoints)
    return endpoints["/generate"]


@pytest.mark.slow
def test_eight_gradio_clients_at_once_get_their_own_results(app_url: str, solo_hashes: list[str]) -> None:
    from gradio_client import Client

    names = [p["parameter_name"] for p in _generate_endpoint(Client(app_url, verbose=False))["parameters"]]
    assert "adapters_json" in names and "prompt" in names, names
    start = threading.Barrier(len(USERS))

    def user(index: int) -> str:
        client = Client(app_url, verbose=False)  # one client (session) per user
        start.wait()
        _, result = client.predict(prompt=REQUEST.prompt, seed=REQUEST.seed, steps=REQUEST.steps,
                                   duration=REQUEST.duration, adapters_json=_settings_json(USERS[index]),
                                   api_name="/generate")
        return result["hash"]

    with ThreadPoolExecutor(len(USERS)) as pool:
        hashes = list(pool.map(user, range(len(USERS))))
    assert hashes == solo_hashes


@pytest.mark.slow
def test_a_bad_adapter_over_http_is_one_line_and_the_app_serves_on(app_url: str, solo_hashes: list[str],
                                                                   tmp_path: Path) -> None:
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    bad = tmp_path / "page.safetensors"
    bad.write_bytes(b"<!DOCTYPE html><html><body>Sign in</body></html>")
    client = Client(app_url, verbose=False)
    with pytest.raises(AppError) as caught:
        client.predict(prompt=REQUEST.prompt, seed=REQUEST.seed, steps=REQUEST.steps, duration=REQUEST.duration,
                       adapters_json=json.dumps([{"source": str(bad)}]), api_name="/generate")
    message = str(caught.value)
    assert "HTML page" in message and "\n" not in message.strip()
    _, result = client.predict(prompt=REQUEST.prompt, seed=REQUEST.seed, steps=REQUEST.steps,
                               duration=REQUEST.duration, adapters_json=_settings_json(USERS[3]),
                               api_name="/generate")
    assert result["hash"] == solo_hashes[3]


def _wait_for_status(job: Any, codes: set[Any], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while job.status().code not in codes:
        assert time.monotonic() < deadline, f"job stuck in {job.status().code}"
        time.sleep(0.05)


@pytest.mark.slow
def test_over_http_the_queue_bound_answers_clearly_when_full(tiny_model, backend: Backend, tmp_path: Path) -> None:
    """The app's queue is as long as the backend's: with the GPU busy, the worker's line full (its jobs reach it at
    once: each page is told its place) and Gradio's queue full, one more client is told so, and the others are
    served."""
    from gradio_client import Client
    from gradio_client.utils import Status

    small = Backend(loaded=tiny_model, output_dir=tmp_path, max_queue=2)
    release = threading.Event()
    blocker = small.worker.submit(lambda ctx: release.wait(120), label="a long job")
    try:
        with running_app(small) as url:
            client = Client(url, verbose=False)
            arguments = dict(prompt=REQUEST.prompt, seed=REQUEST.seed, steps=REQUEST.steps,
                             duration=REQUEST.duration, adapters_json=_settings_json(USERS[1]), api_name="/generate")
            # two run (waiting in the blocked worker's line of 2), two wait in Gradio's queue, one is refused
            jobs = []
            for _ in range(2):
                jobs.append(client.submit(**arguments))
                _wait_for_status(jobs[-1], {Status.PROCESSING, Status.PROGRESS})
            for _ in range(2):
                jobs.append(client.submit(**arguments))
                _wait_for_status(jobs[-1], {Status.IN_QUEUE})
            jobs.append(client.submit(**arguments))
            refused = jobs[-1]
            with pytest.raises(Exception, match=r"(?i)queue is full") as caught:
                refused.result(timeout=60)
            assert "\n" not in str(caught.value).strip()
            release.set()
            served = [job.result(timeout=600)[1]["hash"] for job in jobs[:-1]]
            assert len(set(served)) == 1
    finally:
        release.set()
        blocker.result(timeout=120)
        small.binder.reset()
        small.close()
