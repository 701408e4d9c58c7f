"""A public Space under abuse, replayed: the attacks of a hosted app (``H3APP_HOSTED=1``) over its browser-facing API
on loopback with ``gradio_client``/``httpx`` — caps refused fast in one line, one client cannot fill the queue (a
second visitor's /inspect and /generate still answered), a header bomb refused as fast as a small header is read, with
bounded memory, no file-existence oracle, no traceback or server path in any answer, /monitoring closed. Bounded loops,
bounded waits; the worker is held by a blocker job where a test needs jobs to wait, so nothing depends on speed."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from app_fixtures import running_app
from gradio_client.exceptions import AppError
from test_adapters_abuse import scalar_bomb

from h3app.adapters.header_caps import MAX_TENSORS
from h3app.backend.service import DEMO_ADAPTERS_DIR, Backend
from h3app.hosting.limits import LIMITS

ROOT = Path(__file__).resolve().parents[1]
PER_VISITOR = LIMITS.gpu_per_visitor
GENERATE = dict(prompt="a red fox", seed=1, steps=2, duration=5.0, adapters_json="[]", api_name="/generate")


@contextmanager
def hosted_app(tiny_model: Any, tmp_path_factory: pytest.TempPathFactory, folder: Path,
               max_remote_bytes: int) -> Iterator[tuple[Backend, str, Path]]:
    """``(backend, url, folder)``: the hosted app on loopback, allowed the demo adapters and ``folder``."""
    backend = Backend(loaded=tiny_model, hosted=True, output_dir=tmp_path_factory.mktemp("hosted_out"),
                      allowed_local_dirs=(DEMO_ADAPTERS_DIR, folder), max_remote_bytes=max_remote_bytes)
    with running_app(backend) as url:
        yield backend, url, folder
    backend.binder.reset()
    backend.close()


@pytest.fixture(scope="module")
def hosted(tiny_model, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The hosted app on loopback; its allowed folders are the demo adapters and one holding a header bomb."""
    bombs = tmp_path_factory.mktemp("bombs")
    scalar_bomb(bombs / "bomb.safetensors", MAX_TENSORS + 1)  # the 1.2 M-alpha shape, just past the count cap
    with hosted_app(tiny_model, tmp_path_factory, bombs, 64 * 1024**2) as app:
        yield app


def client(url: str, **headers: str) -> Any:
    from gradio_client import Client

    return Client(url, verbose=False, headers=headers or None, download_files=False)


def refusal(call: Any) -> tuple[str, float]:
    """The one-line message of a refused call, and how long it took (seconds)."""
    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        call()
    return str(caught.value).strip(), time.monotonic() - started


def server_paths(backend: Backend) -> list[str]:
    return [str(ROOT), str(backend.output_dir), sys.prefix, os.path.expanduser("~"), str(DEMO_ADAPTERS_DIR)]


def assert_clean(text: str, backend: Backend) -> None:
    """One line, no traceback, no server folder."""
    assert "\n" not in text and "Traceback" not in text and "File \"" not in text, text[:500]
    for folder in server_paths(backend):
        assert folder not in text, f"{folder} in {text[:300]}"


@pytest.mark.parametrize("arguments, limit", [
    (dict(height=1e9, width=1e9), "pixels"),
    (dict(height=1e300, width=1e300), ""),
    (dict(height=float("nan"), width=64), ""),
    (dict(steps=10**6), "steps"),
    (dict(prompt="x" * 100_000), "prompt"),
])
def test_work_caps_are_refused_fast_in_one_line(hosted: Any, arguments: dict[str, Any], limit: str) -> None:
    backend, url, _ = hosted
    message, seconds = refusal(lambda: client(url).predict(**{**GENERATE, **arguments}))
    assert_clean(message, backend)
    assert limit in message and "Queue is full" not in message
    assert seconds < 30  # refused before the worker: a hosted generate at these sizes would take minutes


def test_a_grid_and_a_megabyte_source_are_refused_in_one_line(hosted: Any) -> None:
    backend, url, _ = hosted
    many = ", ".join(str(i) for i in range(40))
    message, _ = refusal(lambda: client(url).predict(prompt="a fox", steps=2, duration=5.0, height=0, width=0,
                                                     alphas=many, scales=many, seeds="1", adapters_json=json.dumps(
                                                         [{"source": str(DEMO_ADAPTERS_DIR)}]), token="",
                                                     api_name="/grid"))
    assert_clean(message, backend)
    message, _ = refusal(lambda: client(url).predict(slot=1, alpha="auto", scale=1.0, mode="unmerged",
                                                     source="a" * 10_000_000, weight_name="", revision="",
                                                     enabled=True, api_name="/set_lora"))
    assert_clean(message, backend)
    assert len(message) < 1000  # the source is not echoed


@pytest.mark.slow
def test_one_client_cannot_fill_the_queue_and_a_second_visitor_is_served(hosted: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Visitors told apart by address: a proxy on this machine (``FORWARDED_ALLOW_IPS``) names them."""
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "127.0.0.1,::1")
    backend, url, _ = hosted
    release = threading.Event()
    blocker = backend.worker.submit(lambda ctx: release.wait(120), label="a long job")
    flooder = client(url, **{"X-Forwarded-For": "203.0.113.1"})
    try:
        jobs = [flooder.submit(**GENERATE) for _ in range(20)]
        deadline = time.monotonic() + 120
        while sum(job.done() for job in jobs) < len(jobs) - PER_VISITOR and time.monotonic() < deadline:
            time.sleep(0.2)
        refused = [str(job.exception()) for job in jobs if job.done()]
        assert len(refused) == len(jobs) - PER_VISITOR
        assert all(f"you already have {PER_VISITOR} jobs" in m for m in refused), refused
        assert backend.admission.total == PER_VISITOR
        second = client(url, **{"X-Forwarded-For": "203.0.113.2"})
        demo = sorted(p for p in DEMO_ADAPTERS_DIR.iterdir() if p.suffix == ".safetensors")[0]
        info = second.predict(source=str(demo.relative_to(ROOT)), weight_name="", revision="", token="",
                              api_name="/inspect")
        assert info["rank"] > 0  # the cheap event answered while the GPU line is held
        waiting = [second.submit(**GENERATE)]  # admitted: the second visitor has its own share
        same_address = [client(url, **{"X-Forwarded-For": "203.0.113.9"}) for _ in range(PER_VISITOR + 1)]
        waiting += [c.submit(**GENERATE) for c in same_address[:PER_VISITOR]]
        while backend.admission.total < 2 * PER_VISITOR + 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        message, seconds = refusal(lambda: same_address[-1].predict(**GENERATE))
        assert f"you already have {PER_VISITOR} jobs" in message  # many sessions, one address: one share
        assert backend.admission.total == 2 * PER_VISITOR + 1 and not any(job.done() for job in waiting)
    finally:
        for handle in list(backend.worker._pending):  # the admitted jobs need not run: stop them before they start
            handle.cancel()
        release.set()
        blocker.result(timeout=120)
    for job in [*jobs, *waiting]:
        with pytest.raises((CancelledError, AppError)):  # refused at admission, or cancelled before it ran
            job.result(timeout=120)
    assert backend.admission.total == 0


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_the_header_bomb_is_refused_as_fast_as_a_small_header_is_read_with_bounded_memory(hosted: Any) -> None:
    """The bomb's header is never parsed: its refusal takes no longer than reading a demo adapter's small header
    through the same endpoint (a peer in the same run, so a loaded machine slows both), and memory does not grow
    near its size."""
    backend, url, bombs = hosted
    visitor = client(url)
    demo = str(DEMO_ADAPTERS_DIR / "tiny_turbo_4step.safetensors")
    before = rss_bytes()
    bomb_seconds, small_seconds = [], []
    for _ in range(3):
        message, seconds = refusal(lambda: visitor.predict(source=str(bombs / "bomb.safetensors"), weight_name="",
                                                           revision="", token="", api_name="/inspect"))
        assert "tensors" in message, message
        bomb_seconds.append(seconds)
        started = time.monotonic()
        visitor.predict(source=demo, weight_name="", revision="", token="", api_name="/inspect")
        small_seconds.append(time.monotonic() - started)
    print(f"bomb refused in {min(bomb_seconds):.3f} s, a small header read in {min(small_seconds):.3f} s")
    assert min(bomb_seconds) <= 2 * min(small_seconds), (bomb_seconds, small_seconds)  # best of three: load spikes
    assert rss_bytes() - before < 64 * 1024**2  # the header is never parsed: no growth near its size


def test_an_existing_and_a_missing_path_get_the_same_answer(hosted: Any) -> None:
    backend, url, _ = hosted
    visitor = client(url)
    for existing, missing in (("/etc/passwd", "/etc/no-such-file-h3"), ("../../../../etc/passwd",
                                                                          "../../../../etc/no-such-file-h3"),
                              ("/etc", "/no-such-folder-h3")):
        answers = [refusal(lambda s=s: visitor.predict(source=s, weight_name="x", revision="", token="",
                                                       api_name="/inspect"))[0]
                   .replace(os.path.abspath(s), "<path>").replace(s, "<path>") for s in (existing, missing)]
        assert answers[0] == answers[1], answers


def test_no_server_path_in_config_or_answers_and_monitoring_is_closed(hosted: Any) -> None:
    backend, url, _ = hosted
    config = httpx.get(f"{url.rstrip('/')}/config", timeout=30).text
    for folder in server_paths(backend):
        assert folder not in config, folder
    for route in ("/monitoring/summary", "/monitoring"):
        assert httpx.get(f"{url.rstrip('/')}{route}", timeout=30).status_code in (403, 404)
    _, answer = client(url).predict(**GENERATE)
    assert_clean(json.dumps(answer), backend)


def test_an_upload_is_kept_once_and_a_visitor_s_uploads_are_capped(hosted: Any) -> None:
    import gradio as gr
    from gradio.utils import get_upload_folder

    from h3app.ui.adapter.events import AdapterEvents

    backend, _, _ = hosted
    events = AdapterEvents(backend)
    cached = Path(get_upload_folder()) / "h3-quota-test"
    cached.mkdir(parents=True, exist_ok=True)
    size = backend.policy.max_remote_bytes - 1
    kept = []
    for i in range(3):
        upload = cached / f"big{i}.safetensors"
        with upload.open("wb") as handle:  # sparse: the quota counts sizes, the disk holds nothing
            handle.truncate(size)
        if i < 2:
            kept.append(Path(events.upload(str(upload)).source))
            assert not upload.exists() and kept[-1].stat().st_size == size  # moved, not copied
        else:
            with pytest.raises(gr.Error, match="per visitor") as caught:
                events.upload(str(upload))
            assert "\n" not in caught.value.message
            assert not upload.exists()  # a refused upload is deleted at once, not kept for the hourly clean-up
    for path in kept:
        path.unlink()


def join(url: str, api_name: str, session_hash: str, **values: Any) -> None:
    """Queue an event the way the browser does (``POST /queue/join``), without listening for its answer yet: the
    inputs in the event's order, a session's State as null, every other input its API default or ``values``."""
    base = url.rstrip("/")
    config = httpx.get(f"{base}/config", timeout=30).json()
    event = next(d for d in config["dependencies"] if d.get("api_name") == api_name)
    types = {c["id"]: c["type"] for c in config["components"]}
    parameters = iter(httpx.get(f"{base}/gradio_api/info", timeout=30).json()["named_endpoints"][f"/{api_name}"]
                      ["parameters"])
    data = []
    for component in event["inputs"]:
        if types[component] == "state":
            data.append(None)
            continue
        parameter = next(parameters)
        data.append(values.get(parameter["parameter_name"], parameter.get("parameter_default")))
    joined = httpx.post(f"{base}/gradio_api/queue/join", timeout=30, json={
        "data": data, "fn_index": event["id"], "session_hash": session_hash, "event_data": None, "trigger_id": None})
    assert joined.status_code == 200, joined.text


GRID = dict(prompt="a red fox", steps=2, duration=5.0, height=0, width=0, alphas="8", scales="1.0", seeds="1",
            adapters_json=json.dumps([{"source": str(DEMO_ADAPTERS_DIR / "kohya_musubi.safetensors")}]), token="")


@pytest.mark.slow
@pytest.mark.parametrize("api_name, values", [
    ("generate", {k: v for k, v in GENERATE.items() if k != "api_name"}),
    ("grid", GRID),  # a generator event: Gradio itself would stop it only at its next cell
])
def test_a_client_that_goes_away_has_its_job_cancelled_and_the_next_visitor_is_served(
        hosted: Any, api_name: str, values: dict[str, Any]) -> None:
    """Client A's job waits behind a long one; A listens to its event stream, then drops the connection without a
    word. A's job must end cancelled before it runs (the worker records why), and a second visitor's generate
    afterwards completes."""
    from h3app.backend.worker import CLIENT_GONE, Cancelled

    backend, url, _ = hosted
    release = threading.Event()
    blocker = backend.worker.submit(lambda ctx: release.wait(120), label="a long job")
    session = f"visitor-a-{api_name}"
    try:
        join(url, api_name, session, **values)
        deadline = time.monotonic() + 60
        with httpx.stream("GET", f"{url.rstrip('/')}/gradio_api/queue/data", params={"session_hash": session},
                          timeout=30) as stream:
            for _line in stream.iter_lines():  # A listens until its job is in the worker's queue, then hangs up
                queued = [h for h in backend.worker.queued() if h.label == api_name]
                if queued or time.monotonic() > deadline:
                    break
        assert len(queued) == 1, f"A's {api_name} never reached the worker"
        job = queued[0]
        while job.cancel_reason is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert job.cancel_reason == CLIENT_GONE
    finally:
        release.set()
        blocker.result(timeout=120)
    with pytest.raises(Cancelled, match="client went away"):
        job.result(timeout=120)
    _, answer = client(url).predict(**GENERATE)
    assert answer["steps"] == GENERATE["steps"] and answer["frames"] > 0
    deadline = time.monotonic() + 30
    while backend.admission.total and time.monotonic() < deadline:  # A's event ends once its job is done
        time.sleep(0.1)
    assert backend.admission.total == 0


@pytest.mark.parametrize("typed", ["../../../../etc/passwd", "secret/../../../notes.safetensors",
                                   "notes.safetensors", "../" * 200 + "etc/passwd"],
                         ids=["up", "down-and-up", "bare-name", "very-long"])
def test_a_refused_relative_path_is_echoed_as_typed(hosted: Any, typed: str) -> None:
    """The refusal quotes what the visitor typed (cut like every echo), never the path resolved against the server's
    working folder — for /inspect and for a job's adapter."""
    from h3app.rules.values import short

    backend, url, _ = hosted
    visitor = client(url)
    inspected, _ = refusal(lambda: visitor.predict(source=typed, weight_name="", revision="", token="",
                                                   api_name="/inspect"))
    generated, _ = refusal(lambda: visitor.predict(**{**GENERATE, "adapters_json": json.dumps([{"source": typed}])}))
    for message in (inspected, generated):
        assert f"local path {short(typed)} is not allowed" in message, message
        rest = message.replace(short(typed), "")
        assert os.getcwd() not in rest and os.path.abspath(typed) not in rest, message
        assert_clean(message, backend)


def test_x_forwarded_for_counts_only_from_a_space_s_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off a Space the address is the peer the server reports (uvicorn follows the header only from the proxies in
    FORWARDED_ALLOW_IPS), so a directly connected client cannot forge a second share; on a Space, the entry Hugging
    Face's proxy appended (the last one), whatever the client put before it."""
    from types import SimpleNamespace

    from h3app.hosting.visitors import client_address

    def request(forwarded: str, peer: str) -> Any:
        return SimpleNamespace(headers={"x-forwarded-for": forwarded}, client=SimpleNamespace(host=peer))

    monkeypatch.delenv("SPACE_ID", raising=False)
    assert client_address(request("198.51.100.7", "203.0.113.5")) == "203.0.113.5"
    assert client_address(request("198.51.100.7", "127.0.0.1")) is None
    monkeypatch.setenv("SPACE_ID", "owner/space")
    assert client_address(request("198.51.100.7, 203.0.113.5", "10.0.0.2")) == "203.0.113.5"
    assert client_address(request("", "10.0.0.2")) == "10.0.0.2"
