"""Every kind of bad value, posted to every named endpoint of the running app: one line back to the client that names
the problem, nothing run, and no traceback in the server's log (read from its stderr and stdout). The API page shows
each parameter's range and the ``adapters_json`` schema."""

from __future__ import annotations

import json

import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from h3app.backend.service import DEMO_ADAPTERS_DIR
from h3app.rules.choices import LORA_MODES
from h3app.rules.values import ALPHA, STRENGTH
from h3app.ui.session import ADAPTER_SCHEMA, ADAPTERS_JSON_EXAMPLE, ADAPTERS_JSON_SCHEMA, parse_adapters_json

pytestmark = pytest.mark.slow

TURBO = str(DEMO_ADAPTERS_DIR / "tiny_turbo_4step.safetensors")
ONE = json.dumps({"source": TURBO})
FAST = {"steps": 2, "height": 16, "width": 16}

# (endpoint, parameters, words the one-line answer must hold)
CASES = [
    ("/inspect", {"source": "x" * 5000}, "5,000 characters"),
    ("/inspect", {"source": ""}, "source is empty"),
    ("/inspect", {"source": TURBO, "revision": "r" * 5000}, "revision is 5,000 characters"),
    ("/load", {"slot": 3, "source": TURBO}, "slot must be 1 or 2"),
    ("/load", {"slot": "abc", "source": TURBO}, "slot must be 1 or 2"),
    ("/load", {"slot": 1, "source": TURBO, "alpha": "eight"}, "alpha must be a number"),
    ("/load", {"slot": 1, "source": TURBO, "alpha": "1e9"}, "at most 1e+06"),
    ("/load", {"slot": 1, "source": TURBO, "scale": 1e9}, "between -100 and 100"),
    ("/load", {"slot": 1, "source": TURBO, "scale": "abc"}, "scale must be a number"),
    ("/load", {"slot": 1, "source": TURBO, "mode": "mixed"}, "mode must be one of"),
    ("/set_lora", {"slot": 1, "alpha": "0", "source": TURBO}, "> 0"),
    ("/set_lora", {"slot": 1, "scale": -101, "source": TURBO}, "between -100 and 100"),
    ("/generate", {**FAST, "seed": -1}, "seed must be between 0"),
    ("/generate", {**FAST, "seed": 7.5}, "seed must be a whole number"),
    ("/generate", {**FAST, "seed": "abc"}, "seed must be a number"),
    ("/generate", {**FAST, "steps": 1}, "steps must be a whole number between 2"),
    ("/generate", {**FAST, "steps": 1000}, "steps must be a whole number between 2"),
    ("/generate", {**FAST, "steps": 2.5}, "got 2.5"),
    ("/generate", {**FAST, "duration": 1}, "duration must be between 5"),
    ("/generate", {**FAST, "duration": 100}, "duration must be between 5"),
    ("/generate", {**FAST, "height": 33}, "multiple of"),
    ("/generate", {**FAST, "height": -16}, "height must be at least 1"),
    ("/generate", {**FAST, "width": 1e9}, "pixels, more than this model"),
    ("/generate", {**FAST, "shift": -1}, "shift must be a positive number"),
    ("/generate", {**FAST, "audio_shift": "x"}, "audio shift must be a number"),
    ("/generate", {**FAST, "workflow": "t9va"}, "unknown workflow"),
    ("/generate", {**FAST, "prompt": ""}, "prompt is empty"),
    ("/generate", {**FAST, "prompt": "x" * 20_000}, "characters"),
    ("/generate", {**FAST, "adapters_json": "{bad"}, "adapters must be JSON"),
    ("/generate", {**FAST, "adapters_json": '[{"source": ""}]'}, "need a \"source\""),
    ("/generate", {**FAST, "adapters_json": '[{"source":"a"},{"source":"b"},{"source":"c"}]'}, "at most 2 adapters"),
    ("/generate", {**FAST, "adapters_json": json.dumps({"source": TURBO, "alpha": -1})}, "> 0"),
    ("/generate", {**FAST, "adapters_json": json.dumps({"source": TURBO, "scale": 1e9})}, "between -100 and 100"),
    ("/generate", {**FAST, "adapters_json": json.dumps({"source": TURBO, "mode": "x"})}, "mode must be one of"),
    ("/check_equivalence", {"alpha_a": "x", "adapters_json": ONE}, "setting A: alpha must be a number"),
    ("/check_equivalence", {"scale_b": 1e9, "adapters_json": ONE}, "setting B: scale"),
    ("/check_equivalence", {"steps": 0, "adapters_json": ONE}, "steps must be a whole number"),
    ("/grid", {"alphas": "a, b", "adapters_json": ONE}, "alphas must be comma-separated numbers"),
    ("/grid", {"scales": "1e9", "adapters_json": ONE}, "between -100 and 100"),
    ("/grid", {"seeds": "-1", "adapters_json": ONE}, "seed must be between 0"),
    ("/grid", {"alphas": ",".join(str(i + 1) for i in range(100)), "adapters_json": ONE}, "cells, more than"),
]


@pytest.fixture(scope="module")
def url(app):
    """The session's app (tests/browser_fixtures.py: one launch shared by the API and browser tests)."""
    return app[0]


@pytest.fixture(scope="module")
def client(url, tmp_path_factory):
    client = Client(url, download_files=str(tmp_path_factory.mktemp("downloads")), verbose=False)
    yield client
    client.close()


def test_every_kind_of_bad_value_is_one_line_and_no_traceback(client, capfd):
    capfd.readouterr()
    for endpoint, parameters, words in CASES:
        with pytest.raises(AppError) as refused:
            client.predict(api_name=endpoint, **parameters)
        message = str(refused.value).strip()
        assert words in message and "\n" not in message, (endpoint, parameters, message)
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err, (out + err)[-3000:]


def test_non_finite_numbers_sent_as_raw_json_are_refused_in_one_line(url, capfd):
    """JSON's NaN and Infinity (gradio_client refuses to send them; a raw client can)."""
    capfd.readouterr()
    base = {"prompt": "a red ball", "seed": 7, "steps": 2, "duration": 5, "height": 16, "width": 16, "shift": 0,
            "audio_shift": 0, "workflow": "t2va", "first_frame": None, "last_frame": None, "references": None,
            "adapters_json": "", "token": ""}
    order = list(base)
    for name, value in (("seed", "NaN"), ("steps", "Infinity"), ("duration", "-Infinity"), ("shift", "NaN")):
        data = [value if key == name else json.dumps(base[key]) for key in order]
        body = '{"data": [' + ", ".join(data) + "]}"
        with httpx.Client(base_url=url, timeout=60) as http:
            started = http.post("/gradio_api/call/generate", content=body,
                                headers={"content-type": "application/json"})
            assert started.status_code == 200, started.text
            event = started.json()["event_id"]
            answer = http.get(f"/gradio_api/call/generate/{event}").text
        assert "event: error" in answer and name.replace("_", " ") in answer, (name, answer)
        assert "finite" in answer or "must be" in answer, answer
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err, (out + err)[-3000:]


def test_the_adapters_json_schema_is_what_the_parser_takes():
    parsed = parse_adapters_json(ADAPTERS_JSON_EXAMPLE)
    assert parsed[0].alpha == 8.0 and parsed[0].strength == 0.125
    alpha = ADAPTER_SCHEMA["properties"]["alpha"]["oneOf"][0]
    assert (alpha["exclusiveMinimum"], alpha["maximum"]) == (ALPHA.low, ALPHA.high)
    scale = ADAPTER_SCHEMA["properties"]["scale"]
    assert (scale["minimum"], scale["maximum"]) == (STRENGTH.low, STRENGTH.high)
    assert ADAPTER_SCHEMA["properties"]["mode"]["enum"] == list(LORA_MODES)
    assert ADAPTERS_JSON_SCHEMA["oneOf"][1]["maxItems"] == 2
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(ADAPTERS_JSON_EXAMPLE), ADAPTERS_JSON_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"source": "a", "alpha": 0}, ADAPTERS_JSON_SCHEMA)


def test_the_docs_carry_the_schema_the_code_uses():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "ui.md").read_text(encoding="utf-8")
    assert json.dumps(ADAPTERS_JSON_SCHEMA, indent=2, ensure_ascii=False) in text
    assert ADAPTERS_JSON_EXAMPLE in text


def test_the_api_page_data_gives_every_parameter_its_range(client):
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    labels = {p["parameter_name"]: p["label"] for endpoint in api.values() for p in endpoint["parameters"]}
    assert "0 to 9223372036854775807" in labels["seed"] and "2 to 200" in labels["steps"]
    assert "5–14.375 s" in labels["duration"] and "a multiple of 8" in labels["height"]
    assert "> 0 and at most 1e+06" in labels["alpha"] and "between -100 and 100" in labels["scale"]
    assert ADAPTERS_JSON_EXAMPLE in labels["adapters_json"] and '"source"' in labels["adapters_json"]
    assert not any(word in label for label in labels.values()
                   for word in ("_RANGE", "_RULE", "ADAPTERS_JSON", "TEXT_CHARS", "GRID_CELLS"))
