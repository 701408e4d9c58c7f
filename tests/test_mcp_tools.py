"""The app as an MCP server (``python app.py --mcp``: ``build_app(mcp=True)`` + ``launch(mcp_server=True)``), through
Gradio's MCP endpoint with the ``mcp`` client: the tools are listed with typed, described parameters, inspect runs on
a demo adapter, and hosted mode's guards answer an MCP call as they answer any API call."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest

from h3app.backend.service import DEMO_ADAPTERS_DIR, Backend
from h3app.hosting.visitors import UNKNOWN_ADDRESS
from h3app.ui.app_ui import build_app, launch_kwargs
from h3app.ui.serving.mcp_tools import TOOL_NAMES

pytestmark = pytest.mark.slow

KOHYA = DEMO_ADAPTERS_DIR / "kohya_musubi.safetensors"


@contextmanager
def mcp_app(backend: Backend):
    demo = build_app(backend, mcp=True)
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True,
                **launch_kwargs(backend, mcp=True))
    try:
        yield demo.local_url.rstrip("/") + "/gradio_api/mcp/"
    finally:
        demo.close()


def talk(url: str, calls: list[tuple[str, dict[str, Any]]], progress: list[str] | None = None
         ) -> tuple[list[Any], list[Any]]:
    """(the tools listed, each call's result) over MCP's streamable HTTP transport; with ``progress`` (a list the
    progress messages are appended to) every call asks for progress notifications."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async def session() -> tuple[list[Any], list[Any]]:
        async with streamablehttp_client(url) as (read, write, _), ClientSession(read, write) as client:
            await client.initialize()
            tools = (await client.list_tools()).tools
            results = [await client.call_tool(name, arguments,
                                              progress_callback=on_progress if progress is not None else None)
                       for name, arguments in calls]
            return tools, results

    # Its own thread: the session's Playwright browser keeps an event loop running in the main thread, where
    # asyncio.run refuses to start a second one.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, asyncio.wait_for(session(), timeout=180)).result()


@pytest.fixture(scope="module")
def local_url(tiny_model, tmp_path_factory):
    backend = Backend(loaded=tiny_model, output_dir=tmp_path_factory.mktemp("mcp_outputs"))
    try:
        with mcp_app(backend) as url:
            yield url
    finally:
        backend.binder.reset()
        backend.close()


def test_the_tools_are_listed_with_documented_parameters_and_inspect_runs(local_url: str) -> None:
    tools, (inspected,) = talk(local_url, [("inspect_adapter", {"source": str(KOHYA)})])
    by_name = {tool.name: tool for tool in tools}
    assert set(TOOL_NAMES) <= set(by_name)
    for name in TOOL_NAMES:
        assert name.split("_")[0] in ("search", "inspect", "generate", "check")
        assert len(by_name[name].description) > 60, name
    inspect = by_name["inspect_adapter"]
    assert "header only" in inspect.description and "Returns:" in inspect.description
    properties = inspect.inputSchema["properties"]
    assert list(properties)[:2] == ["source", "weight_name"]
    assert properties["source"]["type"] == "string" and "Hub repo id" in properties["source"]["description"]
    generate = by_name["generate_video"].inputSchema["properties"]
    assert generate["seed"]["type"] == "integer" and generate["scale"]["type"] == "number" and "bit for bit" in generate["seed"]["description"]
    assert "source" in by_name["check_alpha_equivalence"].inputSchema["properties"]
    assert not inspected.isError, inspected.content
    info = json.loads(inspected.content[0].text)
    assert info["format"] == "kohya" and info["alpha"] == 1.5 and info["num_targets"] == 28
    assert info["check"] == {"ok": True, "line": "✓ loads: kohya, rank 4, alpha 1.5 (module_tensor), 28 targets"}
    assert info["weight_files"] == [{"name": KOHYA.name, "size": KOHYA.stat().st_size}]


def test_generate_and_check_run_through_mcp(local_url: str) -> None:
    fast = {"steps": 2, "duration": 5.0, "height": 32, "width": 32, "seed": 3}
    generate = ("generate_video", {"prompt": "a fox", "source": str(KOHYA), "alpha": "3", "scale": 0.5, **fast})
    progress: list[str] = []
    _, (video, check) = talk(local_url, [generate, ("check_alpha_equivalence",
                                                    {"source": str(KOHYA), "prompt": "a fox", **fast})], progress)
    assert not video.isError, video.content
    assert any("Progress" in message for message in progress), progress
    url, answer = video.content[0].text, json.loads(video.content[1].text)
    assert url.startswith("http://127.0.0.1") and url.endswith(".mp4")
    adapter = answer["adapters"][0]
    assert adapter["source"] == str(KOHYA) and adapter["resolved_alpha"] == 3.0 and adapter["strength"] == 0.5
    assert adapter["effective_scale"] == 3.0 / 4 * 0.5 and answer["steps"] == 2 and answer["seed"] == 3
    assert not check.isError, check.content
    verdict = json.loads(check.content[0].text)
    assert verdict["identical"] is True and verdict["control_identical"] is True
    # Gradio 6.31 answers a queued tool called without a progress token with str() of all its outputs at once
    _, (plain,) = talk(local_url, [generate])
    assert not plain.isError and len(plain.content) == 1 and ".mp4" in plain.content[0].text
    assert answer["hash"] in plain.content[0].text  # the same seed and settings: the same output


def test_without_mcp_the_tools_are_not_endpoints(backend) -> None:
    named = build_app(backend).get_api_info()["named_endpoints"]
    assert not set(f"/{name}" for name in TOOL_NAMES) & set(named)
    assert launch_kwargs(backend)["mcp_server"] is False and launch_kwargs(backend, mcp=True)["mcp_server"] is True


def test_hosted_guards_answer_mcp_calls(tiny_model, tmp_path_factory, tmp_path) -> None:
    outside = tmp_path / "secret.safetensors"
    outside.write_bytes(KOHYA.read_bytes())
    backend = Backend(loaded=tiny_model, hosted=True, output_dir=tmp_path_factory.mktemp("mcp_hosted"))
    visitor = ["session someone else", f"address {UNKNOWN_ADDRESS}"]  # an MCP call comes from loopback: unknown
    try:
        with mcp_app(backend) as url:
            for _ in range(backend.admission.per_visitor):
                backend.admission.acquire(visitor)  # that address already has its GPU jobs
            try:
                _, (refused, too_long, demo, busy) = talk(url, [
                    ("inspect_adapter", {"source": str(outside)}),
                    ("search_h3_adapters", {"query": "x" * 100_000}),
                    ("inspect_adapter", {"source": str(KOHYA)}),
                    ("generate_video", {"prompt": "a fox", "source": str(KOHYA)})])
            finally:
                for _ in range(backend.admission.per_visitor):
                    backend.admission.release(visitor)
    finally:
        backend.binder.reset()
        backend.close()
    assert busy.isError and "jobs waiting or running (at most 2 per visitor)" in busy.content[0].text
    assert refused.isError and "is not allowed on this server (only uploaded files" in refused.content[0].text
    assert too_long.isError and "query is 100,000 characters long, more than the 4,096 allowed" in \
        too_long.content[0].text
    assert not demo.isError and json.loads(demo.content[0].text)["format"] == "kohya"
    assert str(DEMO_ADAPTERS_DIR) not in demo.content[0].text  # hosted answers name no server folder
