"""The suite's isolation: each test has its own empty Hugging Face home wherever the libraries look for it, and the
session's tiny model is detached and checked bit for bit after every test that used it (tests/conftest.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path, PurePath
from types import SimpleNamespace

import hf_home
import pytest
import torch
from hub_server import FakeHub, point_huggingface_hub_at
from lora_fixtures import build_tiny
from model_state import ModelGuard

from h3app.backend.service import Backend
from h3app.settings import LoRASettings

TURBO = str(Path(__file__).resolve().parents[1] / "assets" / "adapters" / "lightx2v_turbo_no_alpha.safetensors")


def _paths_under(folder: Path) -> list[str]:
    """``module.attribute`` of every library module attribute holding a path inside ``folder``."""
    found = []
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] not in hf_home.SCANNED_PACKAGES or not isinstance(getattr(module, "__dict__", None), dict):
            continue
        for attribute, value in list(vars(module).items()):
            if isinstance(value, (str, PurePath)) and os.fspath(value).startswith(str(folder) + os.sep):
                found.append(f"{name}.{attribute}")
    return found


def test_each_test_has_its_own_empty_hf_home_wherever_the_libraries_look(private_hf_home: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    import diffusers  # noqa: F401  (their import-time copies of the home must be moved too)
    import transformers  # noqa: F401
    from huggingface_hub import constants
    from huggingface_hub.utils import _cache_manager

    assert Path(os.environ["HF_HOME"]) == private_hf_home != hf_home.SESSION_HOME
    assert not any(private_hf_home.iterdir())
    # The libraries are imported now (whichever home they were imported under): a new home must move them all.
    home = hf_home.use_hf_home(monkeypatch, tmp_path / "next")
    assert Path(os.environ["HF_HOME"]) == home
    assert Path(constants.HF_HOME) == home and Path(constants.HF_HUB_CACHE) == home / "hub"
    assert Path(constants.HF_TOKEN_PATH).parent == home  # never the user's token
    assert Path(_cache_manager.HF_HUB_CACHE) == home / "hub"  # scan_cache_dir()'s default, copied at import
    assert _paths_under(hf_home.SESSION_HOME) == [] and _paths_under(private_hf_home) == []
    assert _paths_under(home)  # the scan does see the moved copies


def test_the_cache_that_downloads_fill_is_the_one_scan_cache_dir_reads() -> None:
    from huggingface_hub import constants, scan_cache_dir

    snapshot = Path(constants.HF_HUB_CACHE) / "models--me--cached" / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "lora.safetensors").write_bytes(b"x" * 10)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("c" * 40)
    assert [repo.repo_id for repo in scan_cache_dir().repos] == ["me/cached"]


def test_a_home_made_by_an_earlier_test_is_moved_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A module first imported during a test copies *that* test's home; later tests must not inherit it."""
    earlier = hf_home.use_hf_home(monkeypatch, tmp_path / "earlier")
    module = SimpleNamespace(CACHE=str(earlier / "hub"), OTHER="unrelated")
    monkeypatch.setitem(sys.modules, "h3app._late_import_for_test", module)
    later = hf_home.use_hf_home(monkeypatch, tmp_path / "later")
    assert module.CACHE == str(later / "hub") and module.OTHER == "unrelated"


def test_a_stopped_hub_answers_nothing_even_on_a_pooled_connection(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """The OS reuses ports: a client that kept a keep-alive connection to an earlier test's hub must reach the hub
    now on that port, not the stopped one (which would answer with its own repos and log nothing here)."""
    from huggingface_hub import close_session

    from h3app.adapters.source import list_weight_files

    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "a.safetensors").write_bytes(b"x" * 100)
    old = FakeHub().start()
    old.add_repo("me/multi", tmp_path / "repo")
    point_huggingface_hub_at(monkeypatch, old.endpoint, tmp_path / "hf_home")
    assert [f.name for f in list_weight_files("me/multi")] == ["a.safetensors"]  # a pooled connection to ``old``
    port = int(old.endpoint.rsplit(":", 1)[1])
    old.stop()  # the client is not closed, as when it outlives the test that made it
    new = FakeHub().start(port=port)
    try:
        new.add_repo("me/multi", tmp_path / "repo")
        assert [f.name for f in list_weight_files("me/multi")] == ["a.safetensors"]
        assert [r.path for r in new.requests if r.path.startswith("/api/models")] == ["/api/models/me/multi"]
        assert len(old.requests) == 1
    finally:
        close_session()
        new.stop()


def test_the_stand_in_hubs_log_holds_a_request_as_soon_as_its_client_has_the_answer(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The handler thread logs a request after it has sent the answer: reading the log right after the call must
    wait for it, else a loaded machine (CI) sees an empty log for a request that was answered."""
    import time

    from huggingface_hub import close_session

    from h3app.adapters.source import list_weight_files

    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "a.safetensors").write_bytes(b"x" * 100)
    hub = FakeHub()
    log_answered = hub._record

    def late_record(entry):  # the handler thread is descheduled between answering and logging
        time.sleep(0.5)
        log_answered(entry)

    monkeypatch.setattr(hub, "_record", late_record)
    hub.start()
    try:
        hub.add_repo("me/multi", tmp_path / "repo")
        point_huggingface_hub_at(monkeypatch, hub.endpoint, tmp_path / "hf_home")
        assert [f.name for f in list_weight_files("me/multi")] == ["a.safetensors"]
        assert [r.path for r in hub.requests] == ["/api/models/me/multi"]
    finally:
        close_session()
        hub.stop()


def _model_of(transformer: torch.nn.Module) -> SimpleNamespace:
    return SimpleNamespace(components={"transformer": transformer, "scheduler": object()})


def test_the_guard_fails_loudly_on_a_changed_weight_and_restores_it() -> None:
    model = _model_of(build_tiny())
    guard = ModelGuard(model)
    try:
        assert guard.changes() == []
        weight = model.components["transformer"].transformer_blocks[0].attn.to_q.weight
        before = weight.detach().clone()
        with torch.no_grad():
            weight[0, 0] = -weight[0, 0] if weight[0, 0] != 0 else 1.0
        assert guard.changes() == ["transformer: 1 weights differ from the base "
                                   "(first: transformer_blocks.0.attn.to_q.weight)"]
        with pytest.raises(pytest.fail.Exception, match="left the session's tiny model changed"):
            guard.check_after("test_x")
        assert guard.changes() == [] and torch.equal(weight, before)
        model.components["scheduler"] = object()
        assert guard.changes() == ["component 'scheduler' was replaced or removed"]
    finally:
        guard.close()


def test_an_adapter_a_backend_left_attached_is_detached_by_the_guard(tiny_model, tmp_path: Path) -> None:
    guard = ModelGuard(tiny_model)  # a second guard: the session's also resets this backend after the test
    backend = Backend(loaded=tiny_model, output_dir=tmp_path)
    try:
        assert backend.load(LoRASettings(source=TURBO, alpha=8.0)).report.matched
        assert any("LoRA wrapper" in change for change in guard.changes())
        guard.check_after("test_y")
        assert guard.changes() == []
    finally:
        backend.close()
        guard.close()
