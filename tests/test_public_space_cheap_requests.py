"""A public Space under cheap-request abuse, replayed over loopback with ``gradio_client``/``httpx`` (issue 26, part
one): text bounded before anything else, the allowed-folder check linear, answers without server internals (paths,
identities, Python's own error text), rank refused from the header before any tensor is read, uploads not served.
Bounded in count and time; each test failed on the code before the fix."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_public_space_abuse import ROOT, assert_clean, client, hosted_app, refusal

from h3app.backend.service import DEMO_ADAPTERS_DIR


def write_header(path: Path, raw: bytes, data: bytes = b"") -> Path:
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def rank_bomb(path: Path, rank: int, in_features: int = 16, out_features: int = 432) -> Path:
    """A kohya file with one module of ``rank`` for the tiny model's first AdaLN projection; its data is sparse (the
    size the header declares, zeros, nothing on disk)."""
    stem = "lora_unet_blocks_0_adaln_proj_linear"
    down, up = 2 * rank * in_features, 2 * out_features * rank
    header = {f"{stem}.lora_down.weight": {"dtype": "F16", "shape": [rank, in_features], "data_offsets": [0, down]},
              f"{stem}.lora_up.weight": {"dtype": "F16", "shape": [out_features, rank],
                                         "data_offsets": [down, down + up]}}
    raw = json.dumps(header).encode()
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        handle.truncate(8 + len(raw) + down + up)
    return path


@pytest.fixture(scope="module")
def hosted(tiny_model, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The hosted app on loopback; allowed folders: the demo adapters and one of malformed files."""
    files = tmp_path_factory.mktemp("malformed")
    write_header(files / "deep.safetensors", b'{"a":' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    write_header(files / "digits.safetensors",
                 b'{"a":{"dtype":"F32","shape":[' + b"1" * 100_000 + b'],"data_offsets":[0,4]}}', bytes(4))
    rank_bomb(files / "rank_bomb.safetensors", 100_000)
    with hosted_app(tiny_model, tmp_path_factory, files, 256 * 1024**2) as app:
        yield app


def inspect(visitor: Any, source: str, weight_name: str = "") -> Any:
    return visitor.predict(source=source, weight_name=weight_name, revision="", token="", api_name="/inspect")


@pytest.mark.slow
def test_long_paths_are_refused_first_and_another_visitor_is_not_kept_waiting(
        hosted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four 200 kB paths and one 1 MB path from one visitor (once: 19 s of waiting for the next visitor's /inspect,
    and 5½ minutes of CPU for the 1 MB one) are refused in one line each (by length, or past the visitor's few
    cheap requests in flight), and a second visitor's /inspect answers while they run."""
    backend, url, _ = hosted
    # two visitors, told apart by a trusted proxy's header (on bare loopback all visitors share one share)
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "127.0.0.1,::1")
    flooder = client(url, **{"X-Forwarded-For": "203.0.113.30"})
    second = client(url, **{"X-Forwarded-For": "203.0.113.40"})
    long_paths = ["/x/" + "a/" * 100_000] * 4 + ["/x/" + "a/" * 500_000]
    jobs = [flooder.submit(source=p, weight_name="", revision="", token="", api_name="/inspect") for p in long_paths]
    started = time.monotonic()
    demo = sorted(p.name for p in DEMO_ADAPTERS_DIR.glob("*.safetensors"))[0]
    assert inspect(second, str(DEMO_ADAPTERS_DIR / demo))["rank"] > 0
    assert time.monotonic() - started < 5.0  # was 19 s behind the four 200 kB paths
    messages = []
    for job in jobs:
        with pytest.raises(Exception) as caught:
            job.result(timeout=60)
        messages.append(str(caught.value))
        assert len(messages[-1]) < 300, messages[-1][:300]
    too_long = [m for m in messages if "characters long, more than the 4,096 allowed" in m]
    assert too_long and all(m in too_long or "requests waiting or running" in m for m in messages), messages


def test_the_allowed_folder_check_is_one_realpath_and_a_prefix_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linear in the path's length: one ``realpath`` of the path (and one per allowed folder), then string prefix
    tests; ``Path.parents`` (a new Path per component, each compared: quadratic) is never built."""
    import os
    import pathlib

    from h3app.adapters.source import local

    calls: list[str] = []
    real = os.path.realpath
    monkeypatch.setattr(local.os.path, "realpath", lambda p, *a, **k: calls.append(str(p)) or real(p, *a, **k))
    monkeypatch.setattr(pathlib.PurePath, "parents", property(lambda self: pytest.fail("Path.parents built")))
    folders = [DEMO_ADAPTERS_DIR, ROOT / "bench"]
    assert not local.is_allowed_local_path("/x/" + "a/" * 2040, folders)
    assert local.is_allowed_local_path(DEMO_ADAPTERS_DIR / "kohya_musubi.safetensors", folders)
    assert len(calls) == 2 * (1 + len(folders)) - 1  # the second path is inside the first folder: one prefix test


@pytest.mark.parametrize("weight_name, expected", [
    ("a" * 300 + ".safetensors", "longer than 255 characters"),
    ("loras/" + "b" * 256 + "/x.safetensors", "longer than 255 characters"),
    ("c/" * 2100 + "x.safetensors", "more than the 4,096 allowed"),
])
def test_a_long_weight_name_is_one_line_without_the_server_path(hosted: Any, weight_name: str, expected: str) -> None:
    backend, url, _ = hosted
    message, _ = refusal(lambda: inspect(client(url), str(DEMO_ADAPTERS_DIR.relative_to(ROOT)), weight_name))
    assert expected in message and "Errno" not in message, message[:300]
    assert_clean(message, backend)


def test_a_folder_and_a_load_are_answered_without_server_folders_or_identities(hosted: Any) -> None:
    backend, url, _ = hosted
    visitor = client(url)
    message, _ = refusal(lambda: inspect(visitor, str(DEMO_ADAPTERS_DIR.relative_to(ROOT))))
    assert ".safetensors files" in message, message
    assert_clean(message, backend)
    loaded = visitor.predict(slot=1, source=str(DEMO_ADAPTERS_DIR / "kohya_musubi.safetensors"), weight_name="",
                             revision="", alpha="auto", scale=1.0, mode="unmerged", token="", api_name="/load")
    text = json.dumps(loaded)
    assert_clean(text, backend)
    assert "identity" not in loaded["report"] and "|" not in loaded["report"]["name"], loaded["report"]["name"]
    assert loaded["report"]["num_matched"] > 0


@pytest.mark.parametrize("name, expected", [("deep.safetensors", "nested too deeply"),
                                            ("digits.safetensors", "too many digits")])
def test_malformed_header_json_is_one_clear_line(hosted: Any, name: str, expected: str) -> None:
    backend, url, files = hosted
    message, _ = refusal(lambda: inspect(client(url), str(files / name)))
    assert expected in message and "recursion" not in message and "set_int_max_str_digits" not in message, message
    assert_clean(message, backend)


def test_an_unexpected_error_on_any_endpoint_is_the_generic_line(hosted: Any, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    backend, url, _ = hosted

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"internal state at {backend.output_dir}/secret")

    monkeypatch.setattr(backend, "inspect", broken)
    message, _ = refusal(lambda: inspect(client(url), str(DEMO_ADAPTERS_DIR / "kohya_musubi.safetensors")))
    assert message.startswith("something went wrong on the server (error ") and "secret" not in message, message
    assert_clean(message, backend)


def test_a_huge_rank_is_refused_from_the_header_before_any_tensor_is_read(hosted: Any,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 100,000 on a 16 → 432 layer (a 95 MB file): refused from its header; the tensors are never opened."""
    import safetensors

    backend, url, files = hosted
    opened: list[str] = []
    real = safetensors.safe_open

    def spy(path: Any, framework: str, *args: Any, **kwargs: Any) -> Any:
        if framework == "pt":  # a read of tensors ("numpy" is the library's own header check, which reads none)
            opened.append(str(path))
        return real(path, framework, *args, **kwargs)

    monkeypatch.setattr(safetensors, "safe_open", spy)
    message, _ = refusal(lambda: client(url).predict(
        slot=1, source=str(files / "rank_bomb.safetensors"), weight_name="", revision="", alpha="auto", scale=1.0,
        mode="unmerged", token="", api_name="/load"))
    assert "rank 100,000" in message and "above the limit 512" in message, message
    assert not [p for p in opened if p.endswith("rank_bomb.safetensors")], opened
    assert_clean(message, backend)


def test_an_upload_is_not_served_as_a_file(hosted: Any) -> None:
    from gradio.utils import get_upload_folder

    from h3app.ui.adapter.events import AdapterEvents

    backend, url, _ = hosted
    cached = Path(get_upload_folder()) / "h3-serve-test"
    cached.mkdir(parents=True, exist_ok=True)
    upload = cached / "mine.safetensors"
    upload.write_bytes((DEMO_ADAPTERS_DIR / "kohya_musubi.safetensors").read_bytes())
    kept = Path(AdapterEvents(backend).upload(str(upload)).source)
    try:
        answer = httpx.get(f"{url.rstrip('/')}/gradio_api/file={kept}", timeout=30)
        assert answer.status_code in (403, 404) and b"lora_unet" not in answer.content, answer.status_code
    finally:
        kept.unlink()


def test_gradio_s_upload_cache_is_capped(hosted: Any) -> None:
    """Files uploaded to Gradio but never handed to the app (no visitor to charge them to) count against the cache's
    own cap: past it, the next upload is refused in one line, and deleted at once."""
    import gradio as gr
    from gradio.utils import get_upload_folder

    from h3app.ui.adapter.events import AdapterEvents

    backend, _, _ = hosted
    events = AdapterEvents(backend)
    cache = Path(get_upload_folder())
    stray = cache / "h3-never-handled" / "stray.safetensors"
    stray.parent.mkdir(parents=True, exist_ok=True)
    from h3app.hosting.upload_quota import folder_bytes

    events.uploads.cache_cap = folder_bytes(cache) + 2**20  # this server's cap: 1 MiB over what the cache holds now
    with stray.open("wb") as handle:  # sparse: the quota counts sizes, the disk holds nothing
        handle.truncate(2**20 + 1)
    small = cache / "h3-small-upload" / "small.safetensors"
    small.parent.mkdir(parents=True, exist_ok=True)
    small.write_bytes((DEMO_ADAPTERS_DIR / "kohya_musubi.safetensors").read_bytes())
    try:
        with pytest.raises(gr.Error, match="upload cache is full") as caught:
            events.upload(str(small))
        assert "\n" not in caught.value.message
        assert not small.exists()
    finally:
        stray.unlink()
        small.unlink(missing_ok=True)
