"""The startup page: first-start download progress of a Hub model, served on the app's port while it downloads."""

from __future__ import annotations

import logging
import shutil
import socket
import threading
import time

import pytest

from h3app.model import repo
from h3app.ui.serving.startup_page import StartupPage, progress_text, while_starting

EXTRA = "transformer/extra-shard.safetensors"
EXTRA_BYTES = 12_000_000
CUT_AFTER = 3_000_000


def test_progress_text_counts_gigabytes_and_rounds_the_percentage_down():
    assert progress_text(34_200_000_000, 124_000_000_000) == \
        "Downloading MiniMax-H3 weights: 34.2 of 124 GB (27 %) …"
    assert progress_text(123_999_999_999, 124_000_000_000).endswith("(99 %) …")  # 100 % only when complete
    assert progress_text(124_000_000_000, 124_000_000_000) == \
        "Downloaded MiniMax-H3 weights (124 GB); loading them …"
    assert progress_text(0, 124_000_000_000) == "Downloading MiniMax-H3 weights: 0 of 124 GB (0 %) …"
    assert progress_text(3_500_000, 18_600_000, "h3") == "Downloading h3 weights: 3.5 of 18.6 MB (18 %) …"
    assert progress_text(2_000_000_000, None) == "Downloading MiniMax-H3 weights: 2 GB so far …"
    assert progress_text(14_400_000, 14_400_000, "h3") == "Downloaded h3 weights (14.4 MB); loading them …"
    assert progress_text(500, 2_000, "h3") == "Downloading h3 weights: 0.5 of 2 kB (25 %) …"  # the larger one's unit


@pytest.mark.parametrize(("space_id", "hosted_flag", "hosted"), [(None, None, False), ("owner/space", None, True),
                                                             ("owner/space", "0", False), (None, "1", True)])
def test_hosted_mode_is_one_rule_for_the_backend_and_the_startup_page(monkeypatch, space_id, hosted_flag, hosted):
    from h3app.backend import service

    for name, value in (("SPACE_ID", space_id), ("H3APP_HOSTED", hosted_flag)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert service.hosted_from_env() is hosted  # app.py passes show_log=not hosted_from_env() to the page
    monkeypatch.setattr(service, "Backend", lambda *args, **kwargs: kwargs)  # the settings, not a model
    assert service.backend_from_env("tiny")["hosted"] is hosted


@pytest.mark.parametrize("show_log", [True, False])
def test_a_public_space_keeps_library_log_lines_off_the_startup_page(show_log):
    page = StartupPage("h3", lambda: (1_000_000, 4_000_000), show_log=show_log)
    line = "Fetching 3 files into /data/hf-cache/models--owner--h3/snapshots/abc"
    page.last.handle(logging.LogRecord("huggingface_hub.file_download", logging.INFO, __file__, 1, line, None, None))
    text = page.text()
    assert text.startswith("### H3 LoRA Lab is starting\n\nDownloading h3 weights: 1 of 4 MB (25 %) …")
    assert ("/data/hf-cache" in text) is show_log


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _client(port: int):
    from gradio_client import Client

    return Client(f"http://127.0.0.1:{port}/", verbose=False)


@pytest.mark.slow
def test_the_startup_page_shows_download_progress_from_the_stand_in_hub(fake_hub, tmp_path, monkeypatch):  # noqa: F811
    folder = tmp_path / "h3-big"
    shutil.copytree(repo.TINY_DIR, folder)
    (folder / EXTRA).write_bytes(bytes(range(256)) * (EXTRA_BYTES // 256))
    fake_hub.add_repo("owner/h3-big", folder)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 300)  # the held link must not time out
    # huggingface_hub writes whole chunks (10 MiB by default): 1 MB chunks put exactly the 3 MB sent on disk
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1_000_000)
    fake_hub.interrupt_download(EXTRA, after_bytes=CUT_AFTER, then="hold")  # 3 MB, then a still link
    port = _free_port()
    with while_starting(repo.pending_download("owner/h3-big"), server_name="127.0.0.1", server_port=port) as page:
        assert page is not None
        total = repo.DownloadProgress("owner/h3-big").total
        client = _client(port)
        assert client.predict(api_name="/status").startswith(f"### H3 LoRA Lab is starting\n\n{progress_text(0, total, 'h3-big')}")
        failed: list[BaseException] = []

        def download() -> None:
            try:
                repo.locate("owner/h3-big")
            except BaseException as error:  # noqa: BLE001 - re-raised by the assert below
                failed.append(error)

        worker = threading.Thread(target=download)
        worker.start()
        try:
            expected = progress_text(total - EXTRA_BYTES + CUT_AFTER, total, "h3-big")  # all but 9 MB of the shard
            assert "(" in expected and "%" in expected
            seen = ""
            for _ in range(240):
                seen = client.predict(api_name="/status")
                if expected in seen:
                    break
                time.sleep(0.5)
            assert expected in seen
        finally:
            fake_hub.release_held()
            worker.join(timeout=120)
        assert not failed, failed
        assert progress_text(total, total, "h3-big") in client.predict(api_name="/status")  # then the load
    with pytest.raises(OSError):  # the page gave the port back for the app
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_no_startup_page_for_a_local_model_or_a_complete_download(fake_hub, tmp_path):  # noqa: F811
    with while_starting(repo.pending_download(repo.TINY)) as page:
        assert page is None
    fake_hub.add_repo("owner/h3-small", repo.TINY_DIR)
    repo.locate("owner/h3-small")
    with while_starting(repo.pending_download("owner/h3-small")) as page:
        assert page is None  # everything is cached: nothing to show
    with while_starting(repo.pending_download("owner/not-there")) as page:
        assert page is None  # the download itself will say what is wrong
