"""``python -m h3app search`` and the Hub listing behind it, against the local Hub stand-in (``HF_HUB_OFFLINE=0``
only inside these tests): exactly the MiniMax-H3 adapters, in the order asked, with their weight files and sizes,
the registry's presets and recommended file, gated repos marked, a bounded number of requests, nothing downloaded;
offline and with the Hub out of reach: one line, at once."""

from __future__ import annotations

import json
import socket
import time

import pytest
from cli_runner import assert_one_line, run_cli, run_cli_process
from hub_catalog import (
    BASE,
    FINETUNE,
    LARRY,
    LIGHTX2V,
    NOT_H3_REPO,
    PICKLE,
    STYLE,
    UNTAGGED,
    WAN_LORA,
    serve_catalog,
)
from hub_server import FakeHub, point_huggingface_hub_at, set_offline

from h3app.adapters.source import search
from h3app.errors import H3AppError

BY_DOWNLOADS = [LIGHTX2V, LARRY, STYLE, PICKLE, NOT_H3_REPO]
BY_LIKES = [LARRY, LIGHTX2V, STYLE, PICKLE, NOT_H3_REPO]
BY_UPDATED = [STYLE, LARRY, LIGHTX2V, PICKLE, NOT_H3_REPO]


@pytest.fixture
def catalog(fake_hub: FakeHub, tmp_path):
    sizes = serve_catalog(fake_hub, tmp_path / "repos")
    fake_hub.clear_log()
    return sizes


def listing_requests(hub: FakeHub) -> list:
    """The requests a search made of the Hub (huggingface_hub's own once-a-day agent-registry fetch left out)."""
    return [r for r in hub.requests if r.path.startswith("/api/models") or "/resolve/" in r.path]


@pytest.mark.parametrize("sort, order", [("downloads", BY_DOWNLOADS), ("likes", BY_LIKES), ("updated", BY_UPDATED)])
def test_the_search_lists_exactly_the_h3_adapters_in_the_order_asked(catalog, fake_hub: FakeHub, sort: str,
                                                                     order: list[str]) -> None:
    found = search.search_adapters(sort=sort)
    assert [r.repo_id for r in found] == order
    assert not {BASE, FINETUNE, WAN_LORA, UNTAGGED} & {r.repo_id for r in found}
    by_repo = {r.repo_id: r for r in found}
    for repo_id, sizes in catalog.items():
        assert {f.name: f.size for f in by_repo[repo_id].files} == sizes
    assert by_repo[PICKLE].files == ()  # a .bin is not a weight file the app reads
    assert [r.gated for r in found] == [repo_id == STYLE for repo_id in order]
    assert by_repo[LARRY].downloads == 500 and by_repo[LARRY].likes == 40
    assert by_repo[STYLE].updated.startswith("2025-08-01")


def test_one_listing_call_one_size_call_per_repo_with_weights_and_nothing_downloaded(catalog,
                                                                                    fake_hub: FakeHub) -> None:
    found = search.search_adapters()
    sent = listing_requests(fake_hub)
    listings = [r for r in sent if r.path == "/api/models"]
    infos = [r for r in sent if r.path.startswith("/api/models/")]
    assert len(listings) == 1 and "base_model%3Aadapter%3AMiniMaxAI%2FMiniMax-H3" in listings[0].query
    with_weights = {r.repo_id for r in found if r.files}
    assert sorted(r.path.removeprefix("/api/models/") for r in infos) == sorted(with_weights)
    assert len(sent) == 1 + len(with_weights) <= 1 + len(found)
    assert not [r for r in sent if "/resolve/" in r.path]  # no file touched, not even a header


def test_the_limit_bounds_results_and_requests(catalog, fake_hub: FakeHub) -> None:
    found = search.search_adapters(limit=2)
    assert [r.repo_id for r in found] == BY_DOWNLOADS[:2]
    assert len(listing_requests(fake_hub)) <= 1 + 2


@pytest.mark.parametrize("query", ["turbo", "TURBO"])
def test_a_query_narrows_by_repo_name(catalog, query: str) -> None:
    assert [r.repo_id for r in search.search_adapters(query)] == [LIGHTX2V, LARRY]  # not the Wan LoRA, not notes


def test_cli_json_results_with_known_presets_and_the_recommended_file(catalog, capsys) -> None:
    result = run_cli(capsys, "search", "--json", "--sort", "likes")
    assert result.code == 0, result.err
    results = json.loads(result.out)["results"]
    assert [r["repo_id"] for r in results] == BY_LIKES
    assert set(results[0]) == {"repo_id", "downloads", "likes", "updated", "gated", "files", "known",
                               "recommended"}
    lightx2v = next(r for r in results if r["repo_id"] == LIGHTX2V)
    assert lightx2v["files"] == [{"name": n, "size": s} for n, s in sorted(catalog[LIGHTX2V].items())]
    assert lightx2v["known"]["h3_t2v_4step_v0.1.safetensors"]["steps"] == 5
    assert lightx2v["known"]["h3_fl2v_4step_v0.1.safetensors"]["workflow"] == "fl2va"
    assert lightx2v["known"]["h3_t2v_4step_v0.1.safetensors"]["alpha"] == 8.0
    assert lightx2v["recommended"] == "h3_t2v_4step_v0.1.safetensors"  # the FL2V file is for another workflow
    larry = next(r for r in results if r["repo_id"] == LARRY)
    assert larry["recommended"] == "minimax_h3_turbo_v4_step600_ema.safetensors"
    style = next(r for r in results if r["repo_id"] == STYLE)
    assert style["gated"] is True and style["known"] == {} and style["recommended"] is None


def test_cli_summary_shows_files_sizes_presets_and_marks(catalog, capsys) -> None:
    result = run_cli(capsys, "search", "turbo")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].startswith(f"{LIGHTX2V}  ↓900 ♥10 updated 2025-03-01")
    assert any(line.strip().startswith("★ h3_t2v_4step_v0.1.safetensors  382.9 kB") for line in lines), result.out
    assert any("minimax_h3_turbo_v4_step600_ema.safetensors" in line and "[Larry H3 Turbo v4" in line
               for line in lines)
    assert STYLE not in result.out and "gated" not in result.out


@pytest.mark.parametrize("argv, pattern", [(["--limit", "0"], "limit must be a whole number from 1 to 50"),
                                           (["--limit", "51"], "from 1 to 50"),
                                           (["x" * 97], "search query is 97 characters"),
                                           (["--sort", "stars"], "invalid choice")])
def test_bad_search_arguments_are_one_line(catalog, fake_hub: FakeHub, capsys, argv, pattern) -> None:
    result = run_cli(capsys, "search", *argv)
    assert result.code == 2
    assert_one_line(result.err, pattern)
    assert listing_requests(fake_hub) == []


def test_offline_is_one_line_at_once_without_a_request(catalog, fake_hub: FakeHub, monkeypatch, capsys) -> None:
    set_offline(monkeypatch, True)
    start = time.monotonic()
    result = run_cli(capsys, "search", "turbo")
    assert time.monotonic() - start < 5  # no network, no wait (it is instant; the bound only catches a hang)
    assert result.code == 2 and result.out == ""
    assert_one_line(result.err, "HF_HUB_OFFLINE=1 is set: unset HF_HUB_OFFLINE to search")
    assert listing_requests(fake_hub) == []


def test_offline_from_the_shell_exits_2_with_one_line(tmp_path) -> None:
    done = run_cli_process("search", "--json", env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert_one_line(done.stderr, "HF_HUB_OFFLINE=1")


_BLACK_HOLES: list[socket.socket] = []  # open until the session ends: the hung request never errors into retries


def black_hole_endpoint() -> str:
    """An endpoint on loopback that takes connections and never answers (a Hub that hangs). It stays open for the
    rest of the session, so the search's abandoned request keeps waiting rather than failing into huggingface_hub's
    retries (which reset its shared HTTP client on a refused connection, under other tests' feet)."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    _BLACK_HOLES.append(hole)
    return f"http://127.0.0.1:{hole.getsockname()[1]}"


def test_a_hub_that_does_not_answer_ends_the_search_with_one_line(tmp_path, monkeypatch, capsys) -> None:
    point_huggingface_hub_at(monkeypatch, black_hole_endpoint(), tmp_path / "hf_home")
    monkeypatch.setattr(search, "SEARCH_SECONDS", 2.0)  # huggingface_hub's listing alone would wait for ever
    start = time.monotonic()
    result = run_cli(capsys, "search")
    assert time.monotonic() - start < 10
    assert result.code == 2
    assert_one_line(result.err, r"the Hub at http://127\.0\.0\.1:\d+ did not answer a search within 2 s: check the "
                                r"network connection \(or HF_ENDPOINT\) and retry\.$")


def test_a_hub_error_status_is_one_line(catalog, monkeypatch) -> None:
    monkeypatch.setitem(search.SORTS, "downloads", "stars")  # a sort the Hub does not know: it answers 400
    with pytest.raises(H3AppError, match=r"^the Hub at \S+ answered the search with HTTP 400: retry later\.$"):
        search.search_adapters()
