"""The named API endpoints through ``gradio_client``, against the app launched on 127.0.0.1 with the tiny checkpoint
and the demo adapters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from h3app.backend.service import DEMO_ADAPTERS_DIR

KOHYA = str(DEMO_ADAPTERS_DIR / "kohya_musubi.safetensors")
NO_ALPHA = str(DEMO_ADAPTERS_DIR / "lightx2v_turbo_no_alpha.safetensors")
FAST = {"steps": 2, "duration": 5.0, "height": 32, "width": 32}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def url(app):
    """The session's app (tests/browser_fixtures.py: one launch shared by the API and browser tests)."""
    return app[0]


@pytest.fixture
def client(url, tmp_path):
    client = Client(url, download_files=str(tmp_path), verbose=False)
    yield client
    client.close()


def test_the_six_endpoints_are_named_and_the_ui_events_are_private(client):
    api = client.view_api(print_info=False, return_format="dict")
    assert set(api["named_endpoints"]) == {"/inspect", "/load", "/set_lora", "/generate", "/check_equivalence",
                                           "/grid"}
    assert api["unnamed_endpoints"] == {}
    generate = [p["parameter_name"] for p in api["named_endpoints"]["/generate"]["parameters"]]
    assert generate[:4] == ["prompt", "seed", "steps", "duration"] and "adapters_json" in generate


def test_inspect_returns_the_inspect_json_and_the_weight_files(client):
    info = client.predict(source=KOHYA, api_name="/inspect")
    assert info["format"] == "kohya" and info["alpha"] == 1.5 and info["alpha_source"] == "module_tensor"
    assert info["weight_files"] == [{"name": "kohya_musubi.safetensors", "size": Path(KOHYA).stat().st_size}]


def test_errors_reach_the_client_as_one_line(client, tmp_path):
    with pytest.raises(AppError) as error:
        client.predict(source=str(tmp_path / "missing.safetensors"), api_name="/inspect")
    assert "missing.safetensors" in str(error.value) and "\n" not in str(error.value).strip()
    with pytest.raises(AppError, match="adapter slot 1 is empty"):
        client.predict(slot=1, alpha="8", scale=1.0, mode="unmerged", api_name="/set_lora")


def test_load_and_set_lora_edit_the_session_that_generate_uses(client):
    loaded = client.predict(slot=1, source=NO_ALPHA, alpha="auto", scale=1.0, api_name="/load")
    assert loaded["report"]["num_matched"] > 0 and loaded["settings"]["alpha"] is None
    assert len(loaded["provenance"]["sha256"]) == 64
    edited = client.predict(slot=1, alpha="8", scale=0.5, mode="unmerged", api_name="/set_lora")
    assert edited["adapters"]["1"]["alpha"] == 8.0 and edited["adapters"]["1"]["strength"] == 0.5
    video, result = client.predict(prompt="a fox", seed=4, **FAST, api_name="/generate")
    assert Path(video).is_file() and Path(video).suffix == ".mp4"
    adapter = result["adapters"][0]
    assert adapter["source"] == NO_ALPHA and adapter["resolved_alpha"] == 8.0 and adapter["strength"] == 0.5
    assert result["steps"] == 2 and result["evaluations"] == 1 and result["settings"]["hash"] == result["hash"]
    removed = client.predict(slot=1, alpha="auto", scale=1.0, mode="unmerged", enabled=False, api_name="/set_lora")
    assert removed["adapters"] == {}
    _, base = client.predict(prompt="a fox", seed=4, **FAST, api_name="/generate")
    assert base["adapters"] == [] and base["hash"] != result["hash"]


def test_a_sessionless_client_passes_the_adapters_explicitly(client, url, tmp_path):
    adapters = json.dumps([{"source": KOHYA, "alpha": 3, "scale": 0.5}])
    _, result = client.predict(prompt="a fox", seed=4, adapters_json=adapters, **FAST, api_name="/generate")
    assert result["adapters"][0]["resolved_alpha"] == 3.0 and result["adapters"][0]["strength"] == 0.5
    with pytest.raises(AppError, match="adapters must be JSON"):
        client.predict(prompt="a fox", adapters_json="[{oops", **FAST, api_name="/generate")


def test_check_equivalence_endpoint_reports_identical(client):
    result = client.predict(prompt="a fox", seed=2, steps=2, height=32, width=32,
                            adapters_json=json.dumps({"source": KOHYA}), api_name="/check_equivalence")
    assert result["identical"] is True and result["control_identical"] is True
    assert result["hash_a"] == result["hash_b"] != result["hash_fallback"] and result["max_abs_diff"] == 0.0
    assert result["effective_scale_a"] == result["effective_scale_b"]


def test_grid_endpoint_streams_cells(client):
    job = client.submit(prompt="a fox", steps=2, height=32, width=32, alphas="auto", scales="0.5, 1", seeds="3",
                        adapters_json=json.dumps({"source": KOHYA}), api_name="/grid")
    cells = job.result(timeout=300)
    assert [(c["alpha"], c["strength"]) for c in cells] == [(None, 0.5), (None, 1.0)]
    assert all(c["baseline_psnr"] != "inf" for c in cells)
    assert len(job.outputs()) >= 2  # yielded cell by cell


def test_advanced_strengths_reach_the_run_through_set_lora_and_adapters_json(client):
    client.predict(slot=1, source=KOHYA, alpha="auto", scale=1.0, api_name="/load")
    _, plain = client.predict(prompt="a fox", seed=4, **FAST, api_name="/generate")
    edited = client.predict(slot=1, alpha="auto", scale=1.0, mode="unmerged", audio_strength=0.0,
                            strength_schedule="0.5", block_strength="0:2", api_name="/set_lora")
    assert edited["adapters"]["1"]["audio_strength"] == 0.0 and edited["adapters"]["1"]["block_strength"] == "0:2"
    _, quiet = client.predict(prompt="a fox", seed=4, **FAST, api_name="/generate")
    ran = quiet["adapters"][0]
    assert (ran["video_strength"], ran["audio_strength"], ran["strength_schedule"], ran["block_strength"]) == (
        1.0, 0.0, "0.5", "0:2")
    assert quiet["hash"] != plain["hash"]
    aliases = json.dumps({"source": KOHYA, "audio": 0, "schedule": "0.5", "blocks": "0:2"})
    _, same = client.predict(prompt="a fox", seed=4, adapters_json=aliases, **FAST, api_name="/generate")
    assert same["hash"] == quiet["hash"]  # the JSON keys and the parameters are one setting
    with pytest.raises(AppError, match="has 2 values but this run has 1 evaluation"):
        client.predict(prompt="a fox", adapters_json=json.dumps({"source": KOHYA, "schedule": "1,0.5"}), **FAST,
                       api_name="/generate")
    with pytest.raises(AppError, match="per-modality strength .*unmerged"):
        client.predict(slot=1, alpha="auto", scale=1.0, mode="merged", audio_strength=0.0, api_name="/set_lora")
    client.predict(slot=1, alpha="auto", scale=1.0, mode="unmerged", enabled=False, api_name="/set_lora")
