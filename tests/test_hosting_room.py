"""The hosting room: one table of limits that every bound reads, one place that words a refusal, and the light part
(what the backend imports) loads no Gradio."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from h3app.backend.worker import QueueFull, Worker
from h3app.hosting.admission import Admission, InFlight
from h3app.hosting.join_bound import CheapJoinBound
from h3app.hosting.limits import DOWNLOAD_CACHE_GB_ENV, GB, LIMITS, UPLOAD_CACHE_GB_ENV, UPLOADS_GB_ENV
from h3app.hosting.refusals import Reason, Refused, why_refused
from h3app.hosting.upload_quota import upload_quota

TOP = Path(__file__).resolve().parents[1]


def test_every_reason_is_one_line_naming_its_limit():
    facts = {"limit": 7, "used": 3 * GB, "size": 5 * GB, "quota": 4 * GB, "name": "big.safetensors"}
    for reason in Reason:
        line = why_refused(reason, **facts)
        assert "\n" not in line and line.endswith(".")
        assert "7" in line or "4.0 GiB" in line or "4.3 GB" in line, (reason, line)


def test_each_bound_refuses_with_its_reason_and_the_tables_number():
    admission = Admission()
    keys = ["session a", "address x"]
    for _ in range(LIMITS.gpu_per_visitor):
        admission.acquire(keys)
    with pytest.raises(Refused) as visitor:
        admission.acquire(keys)
    assert visitor.value.reason is Reason.VISITOR_JOBS and visitor.value.facts == {"limit": LIMITS.gpu_per_visitor}
    for i in range(LIMITS.gpu_pending - LIMITS.gpu_per_visitor):
        admission.acquire([f"session {i}", f"address {i}"])
    with pytest.raises(Refused) as busy:
        admission.acquire(["session new", "address new"])
    assert busy.value.reason is Reason.SERVER_BUSY and str(LIMITS.gpu_pending) in str(busy.value)
    off_queue = InFlight()
    for _ in range(LIMITS.off_queue_per_visitor):
        off_queue.acquire(keys)
    with pytest.raises(Refused, match=f"at most {LIMITS.off_queue_per_visitor} per visitor"):
        off_queue.acquire(keys)


def test_the_workers_line_is_the_tables_and_its_refusal_crosses_processes():
    worker = Worker()
    try:
        assert worker.max_queue == LIMITS.worker_line
    finally:
        worker.close()
    full = QueueFull(Reason.WORKER_FULL, limit=3)
    again = pickle.loads(pickle.dumps(full))
    assert type(again) is QueueFull and str(again) == str(full) and again.reason is Reason.WORKER_FULL


def test_upload_quotas_come_from_the_table_and_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(UPLOADS_GB_ENV, raising=False)
    monkeypatch.delenv(UPLOAD_CACHE_GB_ENV, raising=False)
    quota = upload_quota(tmp_path, adapter_bytes=100)
    assert (quota.per_visitor, quota.total) == (LIMITS.adapters_per_visitor * 100, LIMITS.upload_visitors * 200)
    assert quota.cache_cap == int(LIMITS.upload_cache_gb * GB)
    monkeypatch.setenv(UPLOADS_GB_ENV, "0.5")
    monkeypatch.setenv(UPLOAD_CACHE_GB_ENV, "2")
    quota = upload_quota(tmp_path, adapter_bytes=100)
    assert (quota.total, quota.cache_cap) == (GB // 2, 2 * GB)
    with pytest.raises(Refused) as refused:
        quota.reserve("visitor", 201)
    assert refused.value.reason is Reason.VISITOR_UPLOADS


def test_the_download_cache_budget_is_the_tables_hosted_and_none_locally(monkeypatch):
    monkeypatch.delenv(DOWNLOAD_CACHE_GB_ENV, raising=False)
    assert (LIMITS.download_cache(True), LIMITS.download_cache(False)) == (int(LIMITS.download_cache_gb * GB), None)
    monkeypatch.setenv(DOWNLOAD_CACHE_GB_ENV, "1.5")
    assert LIMITS.download_cache(False) == int(1.5 * GB)


def test_the_cheap_join_bound_counts_a_visitors_queued_events_only():
    bound, live = CheapJoinBound(limit=2), set()

    def join(session: str, concurrency_id: str | None = "inspect", queued: bool = True) -> SimpleNamespace:
        return SimpleNamespace(headers={}, client=None, session_hash=session, queued=queued,
                               concurrency_id=concurrency_id)

    for event_id in ("e1", "e2"):
        assert bound.refusal(join("s1"), live.__contains__) is None
        bound.joined(join("s1"), event_id)
        live.add(event_id)
    assert "at most 2 per visitor" in bound.refusal(join("s2"), live.__contains__)  # a new session, same address
    assert bound.refusal(join("s1", concurrency_id="gpu"), live.__contains__) is None  # GPU events: the admission
    assert bound.refusal(join("s1", queued=False), live.__contains__) is None  # off-queue events: InFlight
    live.discard("e1")  # one answered
    assert bound.refusal(join("s1"), live.__contains__) is None


def test_no_bound_of_the_room_is_written_outside_its_table():
    """The numbers of the table are not spelled again as module constants anywhere in h3app (one home)."""
    old_names = re.compile(r"^(MAX_PENDING|PER_VISITOR|CHEAP_PER_VISITOR|OFF_QUEUE_PER_VISITOR|REFUSAL_SLOTS|"
                           r"HOSTED_QUEUE_SIZE|ABANDON_SECONDS|ADAPTERS_PER_VISITOR|TOTAL_VISITORS|UPLOAD_CACHE_GB)"
                           r"\s*=", re.MULTILINE)
    found = [str(p.relative_to(TOP)) for p in (TOP / "h3app").rglob("*.py") if old_names.search(p.read_text())]
    assert found == []
    service = (TOP / "h3app/backend/service.py").read_text()
    assert "max_queue: int = LIMITS.worker_line" in service


def test_the_backends_part_of_the_room_loads_no_gradio():
    code = ("import sys\nimport h3app.hosting.limits, h3app.hosting.refusals, h3app.hosting.admission, "
            "h3app.hosting.visitors\nprint('gradio' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=TOP, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr
