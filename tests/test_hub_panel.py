"""The "Find on the Hub" panel's events without a browser, against the local Hub stand-in: the table, the pick into
adapter 1, the check before download (✓ loads / ✗ why not, header only), and hosted mode's cache and token rule."""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import pytest
from hub_catalog import GATED_TOKEN, LARRY, LIGHTX2V, NOT_H3_REPO, PICKLE, STYLE, serve_catalog
from hub_server import FakeHub

from h3app.backend.adapter_binding import SourcePolicy
from h3app.ui.hub import events as hub_events
from h3app.ui.hub.events import HubEvents


@pytest.fixture
def catalog(fake_hub: FakeHub, tmp_path):
    sizes = serve_catalog(fake_hub, tmp_path / "repos")
    fake_hub.clear_log()
    return sizes


def listings(hub: FakeHub) -> list:
    return [r for r in hub.requests if r.path == "/api/models"]


def weight_gets(hub: FakeHub) -> list:
    """Full downloads of any weight file (a header read is a Range request, never one of these)."""
    return [r for r in hub.requests if r.is_full_get and r.path.endswith(".safetensors")]


def hosted_stub() -> SimpleNamespace:
    """What the search needs of a hosted backend: the flag and the source policy (no model)."""
    return SimpleNamespace(hosted=True, policy=SourcePolicy(hosted=True))


def test_the_table_has_one_row_per_weight_file_with_marks(catalog, backend) -> None:
    view = HubEvents(backend).search_view("", "downloads")
    repos = [r["repo_id"] for r in view.rows]
    assert repos[:3] == [LIGHTX2V] * 3 and repos[3:5] == [LARRY] * 2
    table = view.table.values.tolist()
    assert table[0][:2] == [LIGHTX2V, "h3_fl2v_4step_v0.1.safetensors"]
    assert table[1][1] == "★ h3_t2v_4step_v0.1.safetensors" and table[1][6] == "LightX2V H3 Turbo 4-step v0.1 (544p)"
    assert table[1][2] == "382.9 kB" and table[1][3] == 900
    style = next(row for row in table if STYLE in row[0])
    assert style[0] == f"gated · {STYLE}"
    assert next(row for row in table if PICKLE in row[0])[1] == "—"
    assert "5 MiniMax-H3 adapter repos" in view.note and "7 weight files" in view.note


def test_a_refused_search_is_the_red_line_above_an_empty_table(catalog, backend) -> None:
    view = HubEvents(backend).search_view("x" * 200)
    assert view.rows == [] and view.table.empty
    assert "the search query is 200 characters long" in view.note and "h3-bad" in view.note


def test_a_pick_fills_the_slot_with_the_repo_and_its_files(catalog, backend) -> None:
    events = HubEvents(backend)
    rows = events.search_view("turbo").rows
    index = next(i for i, r in enumerate(rows) if r["name"] == "minimax_h3_turbo_v4_step600_ema.safetensors")
    pick = events.pick(rows, index)
    assert pick.source == LARRY and pick.revision == "" and pick.demo is None
    assert pick.weight["value"] == "minimax_h3_turbo_v4_step600_ema.safetensors"
    assert [value for _, value in pick.weight["choices"]] == sorted(catalog[LARRY])
    with pytest.raises(gr.Error, match="no longer in the results"):
        events.pick(rows, len(rows))


def test_a_repo_without_a_weight_file_cannot_be_picked(catalog, backend) -> None:
    events = HubEvents(backend)
    rows = events.search_view("pickle").rows
    with pytest.raises(gr.Error, match="has no .safetensors file"):
        events.pick(rows, 0)


def test_checks_read_headers_only_and_say_loads_or_why_not(catalog, fake_hub: FakeHub, backend) -> None:
    events = HubEvents(backend)
    ok = events.check(LIGHTX2V, "h3_t2v_4step_v0.1.safetensors")
    assert ok.ok and ok.line == "✓ loads: peft, rank 128, alpha 8 (registry), 24 targets", ok.line
    broken = events.check(NOT_H3_REPO, "other.safetensors")
    assert not broken.ok and broken.line.startswith("✗ ") and "other.safetensors" in broken.line
    gated = events.check(STYLE, "style.safetensors")
    assert not gated.ok and "gated" in gated.line and "no token was given" in gated.line
    assert events.check(STYLE, "style.safetensors", token=GATED_TOKEN).ok
    assert weight_gets(fake_hub) == []


def test_check_fills_the_check_column_a_bounded_number_at_a_time(catalog, fake_hub: FakeHub, backend,
                                                                  monkeypatch) -> None:
    monkeypatch.setattr(hub_events, "MAX_CHECKS", 4)
    events = HubEvents(backend)
    view = events.check_rows(events.search_view("").rows)
    checks = [r["check"] for r in view.rows if r["name"]]
    assert sum(1 for c in checks if c) == 4 and checks[:3] == [c for c in checks[:3] if c.startswith("✓ loads")]
    assert "3 left: press Check again" in view.note
    view = events.check_rows(view.rows)
    assert all(r["check"] for r in view.rows if r["name"])
    assert next(r for r in view.rows if r["repo_id"] == NOT_H3_REPO)["check"].startswith("✗ ")
    assert view.table["check"].tolist() == [r["check"] for r in view.rows]
    assert weight_gets(fake_hub) == []


def test_the_preview_marks_the_picked_row(catalog, backend) -> None:
    events = HubEvents(backend)
    rows = events.search_view("").rows
    info = backend.inspect(LIGHTX2V, rows[1]["name"]).to_json()
    marked = events.mark(rows, 1, info, None)
    assert marked.rows[1]["check"].startswith("✓ loads") and marked.rows[0]["check"] == ""
    refused = events.mark(rows, 0, None, "a one-line reason")
    assert refused.rows[0]["check"] == "✗ a one-line reason"
    assert events.mark(rows, None, info, None) is None


def test_hosted_searches_are_cached_per_token_and_never_send_the_servers_token(catalog, fake_hub: FakeHub,
                                                                               monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_server_own_token")
    events = HubEvents(hosted_stub())
    first = events.search("turbo")
    assert events.search("turbo") == first and len(listings(fake_hub)) == 1  # the second from the cache
    assert not any(r.authorization for r in fake_hub.requests if r.path.startswith("/api/models"))
    events.search("turbo", token="hf_visitor")
    assert len(listings(fake_hub)) == 2 and listings(fake_hub)[-1].authorization  # the visitor's own token
    monkeypatch.setattr(events.cache, "seconds", 0)
    events.search("turbo")
    assert len(listings(fake_hub)) == 3  # stale: asked again


def test_local_searches_are_not_cached_and_use_the_users_token(catalog, fake_hub: FakeHub, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_user_token")
    events = HubEvents(SimpleNamespace(hosted=False, policy=SourcePolicy(hosted=False)))
    events.search("turbo")
    events.search("turbo")
    assert len(listings(fake_hub)) == 2 and all(r.authorization for r in listings(fake_hub))


def test_the_panels_events_are_private_cheap_and_queued_where_the_visitor_bound_counts(tiny_model,
                                                                                      tmp_path_factory) -> None:
    from h3app.backend.service import Backend
    from h3app.hosting.gpu_gate import GPU_CONCURRENCY_ID
    from h3app.ui.app_ui import build_app

    backend = Backend(loaded=tiny_model, hosted=True, output_dir=tmp_path_factory.mktemp("hub_hosted"))
    try:
        demo = build_app(backend)
        named = {fn.fn.__qualname__.rpartition(".")[2]: fn for fn in demo.fns.values()
                 if fn.fn is not None and fn.fn.__qualname__.startswith("wire_hub_panel.")}
        assert set(named) == {"search", "check", "pick", "mark"}  # and, after the pick, the slot's own Inspect
        for name in ("search", "check"):  # queued, not GPU: hosting.join_bound counts them against the visitor's bound
            event = named[name]
            assert event.queue is not False and event.concurrency_id == "hub" != GPU_CONCURRENCY_ID
            assert event.api_visibility == "private" and getattr(event.fn, "__h3_guarded__", False)
        assert named["pick"].queue is False and named["mark"].queue is False  # filling the slot: off the queue
        assert isinstance(HubEvents(backend).cache, hub_events.RecentSearches)
    finally:
        backend.close()
