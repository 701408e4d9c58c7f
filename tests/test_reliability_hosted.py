"""Reliability: hosted mode's security rules (docs/security.md), against the fake Hub.

- The server's own ``HF_TOKEN`` is never lent to visitors: nothing a visitor asks for is fetched with it.
- A visitor's token is used for that visitor's request only, and never written into results or messages.
- Local paths: only the allowed folders, symlinks resolved; a refusal reveals nothing about other files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bad_inputs import good_tensors
from hub_server import FakeHub
from lora_fixtures import state_hash
from safetensors.torch import save_file

from h3app.backend import media
from h3app.backend.service import Backend
from h3app.errors import H3AppError
from h3app.lora.layers import LoRALinear
from h3app.request import GenerationRequest
from h3app.rules.values import short
from h3app.settings import LoRASettings

REQUEST = GenerationRequest(prompt="a gated secret", seed=4, steps=2)
SERVER_TOKEN = "hf_SERVER_secret_never_lend_0123456789"
VISITOR_TOKEN = "hf_VISITOR_own_token_9876543210"


@pytest.fixture
def repo_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    save_file(good_tensors(), str(folder / "lora.safetensors"))
    return folder


@pytest.fixture
def hosted(tiny_model, tmp_path: Path) -> Backend:
    assert not any(isinstance(m, LoRALinear) for m in tiny_model.transformer().modules())
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    backend = Backend(loaded=tiny_model, hosted=True, allowed_local_dirs=[uploads], max_remote_bytes=10**7,
                      output_dir=tmp_path / "outputs")
    yield backend
    backend.binder.reset()
    backend.close()


def url(hub: FakeHub, repo: str) -> str:
    return f"{hub.endpoint}/{repo}/resolve/main/lora.safetensors"


def test_the_servers_token_is_never_lent_to_visitors(fake_hub: FakeHub, repo_folder: Path, hosted: Backend,
                                                     tiny_model, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add_repo("owner/gated-for-server", repo_folder, gated_token=SERVER_TOKEN)
    monkeypatch.setenv("HF_TOKEN", SERVER_TOKEN)  # the Space's own secret
    base = state_hash(tiny_model.transformer())
    source = url(fake_hub, "owner/gated-for-server")
    for call in (lambda: hosted.inspect(source), lambda: hosted.load(LoRASettings(source=source)),
                 lambda: hosted.generate(REQUEST, [LoRASettings(source=source)])):
        with pytest.raises(H3AppError, match="gated and no token was given"):
            call()
    assert [f.name for f in hosted.list_weights("owner/gated-for-server")] == ["lora.safetensors"]  # public listing
    assert state_hash(tiny_model.transformer()) == base
    sent = [r for r in fake_hub.requests if "gated-for-server" in r.path]
    assert sent and not any(r.authorization for r in sent), "a request went out with the server's token"
    # the same backend code with hosted=False does use HF_TOKEN (so the refusal above is the policy, not a bug)
    local = Backend(loaded=tiny_model, output_dir=tmp_path / "local_outputs")
    try:
        assert local.inspect(source).num_targets == 6
    finally:
        local.close()


def test_a_visitors_token_serves_that_request_only_and_is_never_recorded(
        fake_hub: FakeHub, repo_folder: Path, hosted: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add_repo("owner/gated-for-visitor", repo_folder, gated_token=VISITOR_TOKEN)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    source = url(fake_hub, "owner/gated-for-visitor")
    assert hosted.inspect(source, token=VISITOR_TOKEN).num_targets == 6
    with pytest.raises(H3AppError, match="gated and no token was given"):
        hosted.inspect(source)  # the next visitor without a token
    output = hosted.generate(REQUEST, [LoRASettings(source=source, alpha=8.0)], token=VISITOR_TOKEN)
    hosted.binder.reset()
    recorded = json.dumps(output.settings) + json.dumps(output.to_json(), default=str)
    assert VISITOR_TOKEN not in recorded
    embedded = media.probe_mp4(output.video_path).settings
    assert embedded and VISITOR_TOKEN not in json.dumps(embedded)
    with pytest.raises(H3AppError) as caught:
        hosted.inspect(source, token=VISITOR_TOKEN + "x")  # a wrong token: refused, and not echoed back
    assert VISITOR_TOKEN not in str(caught.value)


def test_a_gated_file_downloaded_for_one_visitor_is_not_served_from_the_cache_to_the_next(
        fake_hub: FakeHub, repo_folder: Path, hosted: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add_repo("owner/gated-for-visitor", repo_folder, gated_token=VISITOR_TOKEN)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    settings = LoRASettings(source=url(fake_hub, "owner/gated-for-visitor"), alpha=8.0)
    assert hosted.load(settings, token=VISITOR_TOKEN).report.matched  # visitor A downloads it
    hosted.binder.reset()  # nothing attached any more
    with pytest.raises(H3AppError, match="gated and no token was given"):
        hosted.load(settings)  # visitor B, no token


def test_a_gated_adapter_attached_for_one_visitor_is_not_usable_by_the_next_without_a_token(
        fake_hub: FakeHub, repo_folder: Path, hosted: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add_repo("owner/gated-for-visitor", repo_folder, gated_token=VISITOR_TOKEN)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    settings = LoRASettings(source=url(fake_hub, "owner/gated-for-visitor"), alpha=8.0)
    hosted.generate(REQUEST, [settings], token=VISITOR_TOKEN)  # visitor A: allowed, adapter stays attached
    with pytest.raises(H3AppError, match="gated and no token was given"):
        hosted.generate(REQUEST, [settings])  # visitor B, same settings, no token


def test_gated_stays_gated_on_an_offline_server(fake_hub: FakeHub, repo_folder: Path, hosted: Backend,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline (``HF_HUB_OFFLINE=1``) nobody can ask the Hub: a cached gated file is served only to the token that
    opened it online; a public one checked online to anyone; one never checked to nobody."""
    from hub_server import set_offline

    fake_hub.add_repo("owner/gated-offline", repo_folder, gated_token=VISITOR_TOKEN)
    fake_hub.add_repo("owner/public-offline", repo_folder)
    fake_hub.add_repo("owner/never-checked", repo_folder)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    gated, public, unchecked = (LoRASettings(source=url(fake_hub, f"owner/{name}"), alpha=8.0)
                                for name in ("gated-offline", "public-offline", "never-checked"))
    assert hosted.load(gated, token=VISITOR_TOKEN).report.matched  # online: visitor A, with the token
    assert hosted.load(public).report.matched  # online: anyone
    local = Backend(loaded=hosted.binder.model, output_dir=hosted.output_dir / "local")
    try:
        local.load(unchecked)  # in the cache, but never checked by the hosted server
    finally:
        local.binder.reset()
        local.close()
    hosted.binder.reset()
    set_offline(monkeypatch, True)
    with pytest.raises(H3AppError, match="offline .* cannot ask the Hub who may read it") as caught:
        hosted.load(gated)  # visitor B, no token
    assert "\n" not in str(caught.value)
    with pytest.raises(H3AppError, match="offline"):
        hosted.load(gated, token=VISITOR_TOKEN + "x")
    with pytest.raises(H3AppError, match="offline"):
        hosted.load(unchecked)
    assert hosted.load(gated, token=VISITOR_TOKEN).report.matched
    assert hosted.load(public).report.matched
    hosted.binder.reset()


def test_local_refusals_reveal_nothing_about_the_servers_files(hosted: Backend, tmp_path: Path) -> None:
    secret = tmp_path / "secret.safetensors"
    save_file(good_tensors(), str(secret))
    messages: dict[str, str] = {}
    for name, path in (("exists", secret), ("missing", tmp_path / "missing.safetensors"),
                       ("folder", tmp_path), ("system", Path("/etc/shadow"))):
        with pytest.raises(H3AppError) as caught:
            hosted.inspect(str(path))
        messages[name] = str(caught.value).replace(short(str(path)), "PATH")  # echoed as typed, cut like any echo
    assert len(set(messages.values())) == 1, messages  # the same sentence whether the file exists or not
    assert "not allowed on this server" in messages["exists"]


def test_uploads_inside_the_allowed_folder_are_served_and_traversal_out_of_it_is_not(hosted: Backend,
                                                                                     tmp_path: Path) -> None:
    uploads = tmp_path / "uploads"  # the hosted fixture's allowed folder
    save_file(good_tensors(), str(uploads / "mine.safetensors"))
    save_file(good_tensors(seed=3), str(tmp_path / "theirs.safetensors"))
    assert hosted.inspect(str(uploads / "mine.safetensors")).num_targets == 6
    refused: dict[str, Any] = {
        "dotdot in SOURCE": str(uploads / ".." / "theirs.safetensors"),
        "symlink to a file": uploads / "link.safetensors",
        "symlinked folder": uploads / "linked",
    }
    (uploads / "link.safetensors").symlink_to(tmp_path / "theirs.safetensors")
    (uploads / "linked").symlink_to(tmp_path, target_is_directory=True)
    for what, source in refused.items():
        with pytest.raises(H3AppError, match="not allowed on this server"):
            hosted.load(LoRASettings(source=str(source), weight_name="theirs.safetensors" if "folder" in what
                                     else None))
    with pytest.raises(H3AppError, match=r"contains '\.\.'"):
        hosted.load(LoRASettings(source=str(uploads), weight_name="../theirs.safetensors"))
    with pytest.raises(H3AppError, match="pickle"):
        hosted.load(LoRASettings(source=str(uploads), weight_name="mine.pt"))


def test_one_visitors_upload_is_not_listed_or_loadable_by_another(hosted: Backend) -> None:
    uploads = hosted.uploads_dir
    alice = Path(uploads) / "upload-aaaaaaaaaaaa" / "alice_private_style.safetensors"
    alice.parent.mkdir(parents=True)
    save_file(good_tensors(), str(alice))
    mine = Path(uploads) / "upload-bbbbbbbbbbbb" / "mine.safetensors"
    mine.parent.mkdir(parents=True)
    save_file(good_tensors(seed=2), str(mine))
    assert hosted.inspect(str(mine)).num_targets == 6  # my own upload, by its path
    try:
        names = [f.name for f in hosted.list_weights(str(uploads))]
    except H3AppError:
        names = []
    assert not any("alice" in name for name in names), names
    with pytest.raises(H3AppError) as caught:
        hosted.inspect(str(uploads))
    assert "alice" not in str(caught.value)
    with pytest.raises(H3AppError):
        hosted.load(LoRASettings(source=str(uploads),
                                 weight_name="upload-aaaaaaaaaaaa/alice_private_style.safetensors"))
