"""A public Space under queue abuse, replayed over loopback with ``gradio_client``/``httpx`` (issue 26, part two):
cancels that stop the job, joins nobody listens to counted as abandoned, one share for visitors whose address is
unknown (new session hashes and a rotating ``X-Forwarded-For`` from loopback buy nothing), the worker round-robin
across visitors, and a per-visitor bound on cheap events so that another visitor never gets "Queue is full".
Bounded in count and time; the worker is held by a blocker job where jobs must wait. Each test failed on the code
before the fix."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from app_fixtures import running_app
from test_public_space_abuse import GENERATE, client, join

from h3app.backend.service import DEMO_ADAPTERS_DIR, Backend
from h3app.backend.worker import CLIENT_GONE, Worker
from h3app.hosting.limits import LIMITS

pytestmark = pytest.mark.slow  # every test here queues jobs on a launched hosted app

DEMO = str(DEMO_ADAPTERS_DIR / "kohya_musubi.safetensors")
PER_VISITOR, CHEAP_PER_VISITOR, ABANDON_SECONDS = LIMITS.gpu_per_visitor, LIMITS.cheap_per_visitor, LIMITS.abandon_seconds


@pytest.fixture(scope="module")
def hosted(tiny_model, tmp_path_factory: pytest.TempPathFactory) -> Any:
    backend = Backend(loaded=tiny_model, hosted=True, output_dir=tmp_path_factory.mktemp("hosted_queue"),
                      allowed_local_dirs=(DEMO_ADAPTERS_DIR,))
    with running_app(backend) as url:
        yield backend, url
    backend.binder.reset()
    backend.close()


class Blocker:
    """A long job holding the worker, so that the jobs behind it wait in its line."""

    def __init__(self, backend: Backend) -> None:
        self.release = threading.Event()
        self.handle = backend.worker.submit(lambda ctx: self.release.wait(120), label="a long job")

    def stop(self, backend: Backend) -> None:
        for handle in backend.worker.queued():  # the waiting jobs need not run: stop them before they start
            handle.cancel()
        self.release.set()
        self.handle.result(timeout=120)


def queued_job(backend: Backend, label: str, deadline: float) -> Any:
    while time.monotonic() < deadline:
        found = [h for h in backend.worker.queued() if h.label == label]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no {label} job reached the worker")


def wait_until(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return condition()


def settle(backend: Backend) -> None:
    assert wait_until(lambda: backend.admission.total == 0, 60), backend.admission.total


def test_a_cancel_stops_the_job(hosted: Any) -> None:
    """``job.cancel()`` (``POST /gradio_api/cancel``) while the job waits behind another: the job is told to stop
    (it never starts), the client still connected."""
    backend, url = hosted
    blocker = Blocker(backend)
    try:
        visitor = client(url)
        job = visitor.submit(**GENERATE)
        handle = queued_job(backend, "generate", time.monotonic() + 60)
        job.cancel()
        assert wait_until(lambda: handle.cancel_reason is not None, 10), "the cancelled job was never stopped"
    finally:
        blocker.stop(backend)
    settle(backend)


def test_a_join_whose_stream_is_never_opened_counts_as_abandoned(hosted: Any) -> None:
    backend, url = hosted
    blocker = Blocker(backend)
    try:
        join(url, "generate", "never-listens", **{k: v for k, v in GENERATE.items() if k != "api_name"})
        handle = queued_job(backend, "generate", time.monotonic() + 60)
        assert wait_until(lambda: handle.cancel_reason == CLIENT_GONE, ABANDON_SECONDS + 10), handle.cancel_reason
    finally:
        blocker.stop(backend)
    settle(backend)


@pytest.mark.parametrize("headers", [lambda i: {}, lambda i: {"X-Forwarded-For": f"198.51.100.{i + 1}"}],
                         ids=["new-session-hashes", "rotating-x-forwarded-for"])
def test_visitors_without_a_known_address_share_one_share(hosted: Any, headers: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Six sessions from loopback (no proxy configured), each with one /generate: 2 admitted in all, the rest told
    they already have 2 jobs — not 8 admitted and everyone else told the server is busy."""
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    backend, url = hosted
    blocker = Blocker(backend)
    try:
        jobs = [client(url, **headers(i)).submit(**GENERATE) for i in range(6)]
        assert wait_until(lambda: sum(j.done() for j in jobs) >= len(jobs) - PER_VISITOR, 60)
        refused = [str(j.exception()) for j in jobs if j.done()]
        assert len(refused) == len(jobs) - PER_VISITOR and backend.admission.total == PER_VISITOR, refused
        assert all(f"you already have {PER_VISITOR} jobs" in m for m in refused), refused
    finally:
        blocker.stop(backend)
    settle(backend)


def test_the_worker_serves_visitors_round_robin() -> None:
    """A queued three jobs, then B one: B's runs second, not fourth."""
    worker = Worker(max_queue=8)
    release, ran = threading.Event(), []
    try:
        blocker = worker.submit(lambda ctx: release.wait(60), label="blocker")
        assert wait_until(lambda: worker.current is blocker, 30)
        handles = [worker.submit(lambda ctx, n=n: ran.append(n), label=n, owner=owner)
                   for n, owner in (("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B"))]
        assert [h.label for h in worker.queued()] == ["a1", "b1", "a2", "a3"]
        assert [h.progress.position for h in handles] == [1, 3, 4, 2]
        release.set()
        for handle in [blocker, *handles]:
            handle.result(timeout=60)
        assert ran == ["a1", "b1", "a2", "a3"]
    finally:
        release.set()
        worker.close()


def test_one_visitor_s_cheap_flood_never_makes_another_s_request_wait_or_fail(
        hosted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Visitor A sends 80 /inspect whose answers hang; A gets its few in flight and one-line refusals for the
    rest, and visitor B's /inspect answers at once — never "Queue is full"."""
    backend, url = hosted
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "127.0.0.1,::1")  # a proxy on this machine: its header is trusted
    held, release, real = [], threading.Event(), backend.inspect

    def slow_for_a(source: str, *args: Any, **kwargs: Any) -> Any:
        if source.endswith("#a"):
            held.append(source)
            release.wait(60)
            raise AssertionError("A's request was let go")
        return real(source, *args, **kwargs)

    monkeypatch.setattr(backend, "inspect", slow_for_a)
    a, b = client(url, **{"X-Forwarded-For": "203.0.113.10"}), client(url, **{"X-Forwarded-For": "203.0.113.20"})
    try:
        flood = [a.submit(source="owner/repo#a", weight_name="", revision="", token="", api_name="/inspect")
                 for _ in range(80)]
        assert wait_until(lambda: sum(j.done() for j in flood) >= len(flood) - CHEAP_PER_VISITOR, 60)
        refused = [str(j.exception()) for j in flood if j.done()]
        assert all(f"you already have {CHEAP_PER_VISITOR} requests" in m for m in refused), set(refused)
        started = time.monotonic()
        info = b.predict(source=DEMO, weight_name="", revision="", token="", api_name="/inspect")
        assert info["rank"] > 0 and time.monotonic() - started < 10
        assert len(held) <= CHEAP_PER_VISITOR
    finally:
        release.set()
    base = url.rstrip("/")
    assert httpx.get(f"{base}/config", timeout=30).status_code == 200
