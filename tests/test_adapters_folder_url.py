"""A folder URL (``…/tree/<rev>/<folder>``, also ``blob/``) names a folder of a Hub repo: with ``--weight-name`` it
names one file in it, without one the folder's only ``.safetensors`` file; tested for real against the Hub
stand-in (``tests/hub_server.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hub_server import FakeHub
from safetensors.torch import save_file

from h3app.adapters.header import read_local_header
from h3app.adapters.source import MultipleWeightFiles, fetch, list_weight_files, parse_source, read_header
from h3app.errors import H3AppError


def _adapter(path: Path, alpha: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"transformer_blocks.0.attn.to_q.lora_A.weight": torch.ones(2, 8),
               "transformer_blocks.0.attn.to_q.lora_B.weight": torch.ones(8, 2),
               "transformer_blocks.0.attn.to_q.alpha": torch.tensor(alpha)}, str(path))
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    folder = tmp_path / "repo"
    _adapter(folder / "top.safetensors", 1.0)
    _adapter(folder / "adapters" / "x.safetensors", 2.0)
    _adapter(folder / "adapters" / "y.safetensors", 3.0)
    (folder / "adapters" / "adapter_config.json").write_text('{"r": 2, "lora_alpha": 2}')
    _adapter(folder / "deep" / "er" / "only.safetensors", 4.0)
    _adapter(folder / "twice" / "x.safetensors", 5.0)
    _adapter(folder / "twice" / "twice" / "x.safetensors", 6.0)
    _adapter(folder / "nest" / "nest" / "z.safetensors", 7.0)
    return folder


def _url(hub: FakeHub, kind: str, rev: str, folder: str) -> str:
    return f"https://huggingface.co/ORG/REPO/{kind}/{rev}/{folder}"


@pytest.mark.parametrize("kind", ["tree", "blob"])
def test_folder_url_with_weight_name_resolves_to_one_file(fake_hub: FakeHub, repo: Path, kind: str) -> None:
    commit = fake_hub.add_repo("ORG/REPO", repo)
    url = _url(fake_hub, kind, "main", "adapters")
    ref = parse_source(url, weight_name="x.safetensors")
    assert (ref.repo_id, ref.revision, ref.filename) == ("ORG/REPO", "main", "adapters/x.safetensors")

    adapter = fetch(url, weight_name="x.safetensors")
    assert (adapter.repo_id, adapter.revision, adapter.commit, adapter.filename) == (
        "ORG/REPO", "main", commit, "adapters/x.safetensors")
    assert adapter.path.read_bytes() == (repo / "adapters" / "x.safetensors").read_bytes()
    assert adapter.adapter_config_path is not None and adapter.adapter_config_path.name == "adapter_config.json"
    assert "adapters/y.safetensors" not in fake_hub.downloaded_files("ORG/REPO")
    header = read_header(url, weight_name="x.safetensors")
    assert header.scalars == {"transformer_blocks.0.attn.to_q.alpha": 2.0}


def test_a_weight_name_that_already_contains_the_folder(fake_hub: FakeHub, repo: Path) -> None:
    fake_hub.add_repo("ORG/REPO", repo)
    url = _url(fake_hub, "tree", "main", "adapters")
    assert fetch(url, weight_name="adapters/y.safetensors").filename == "adapters/y.safetensors"
    # …or a same-named subfolder, when only that one exists.
    nest = _url(fake_hub, "tree", "main", "nest")
    assert fetch(nest, weight_name="nest/z.safetensors").filename == "nest/nest/z.safetensors"


def test_nested_folders(fake_hub: FakeHub, repo: Path) -> None:
    fake_hub.add_repo("ORG/REPO", repo)
    url = _url(fake_hub, "tree", "main", "deep/er")
    assert fetch(url, weight_name="only.safetensors").filename == "deep/er/only.safetensors"
    assert fetch(url).filename == "deep/er/only.safetensors"  # the folder's only file
    assert read_header(_url(fake_hub, "blob", "main", "deep")).scalars == {
        "transformer_blocks.0.attn.to_q.alpha": 4.0}  # files under nested folders count


def test_a_folder_with_several_files_lists_only_its_own(fake_hub: FakeHub, repo: Path) -> None:
    fake_hub.add_repo("ORG/REPO", repo)
    url = _url(fake_hub, "tree", "main", "adapters")
    assert [f.name for f in list_weight_files(url)] == ["adapters/x.safetensors", "adapters/y.safetensors"]
    with pytest.raises(MultipleWeightFiles) as raised:
        fetch(url)
    assert [f.name for f in raised.value.files] == ["adapters/x.safetensors", "adapters/y.safetensors"]
    assert "folder adapters/" in str(raised.value)
    assert fake_hub.downloaded_files("ORG/REPO") == set()


def test_ambiguous_weight_name_is_one_clear_line(fake_hub: FakeHub, repo: Path) -> None:
    fake_hub.add_repo("ORG/REPO", repo)
    url = _url(fake_hub, "tree", "main", "twice")
    with pytest.raises(H3AppError) as raised:
        fetch(url, weight_name="twice/x.safetensors")
    message = str(raised.value)
    assert "\n" not in message and "is ambiguous" in message
    assert "twice/x.safetensors and twice/twice/x.safetensors" in message and "/resolve/" in message
    assert fake_hub.downloaded_files("ORG/REPO") == set()
    # Unambiguous spellings of the same two files work.
    assert fetch(url, weight_name="x.safetensors").filename == "twice/x.safetensors"
    assert fetch(url, weight_name="twice/twice/x.safetensors").filename == "twice/twice/x.safetensors"


def test_missing_file_in_a_folder_names_the_folder_and_its_files(fake_hub: FakeHub, repo: Path) -> None:
    fake_hub.add_repo("ORG/REPO", repo)
    with pytest.raises(H3AppError, match=r"adapters/nope\.safetensors is not in Hub repo ORG/REPO folder adapters/ "
                                         r"at revision main; its \.safetensors files: adapters/x\.safetensors"):
        fetch(_url(fake_hub, "tree", "main", "adapters"), weight_name="nope.safetensors")


def test_folder_url_revision_and_endpoint_urls(fake_hub: FakeHub, repo: Path, tmp_path: Path) -> None:
    fake_hub.add_repo("ORG/REPO", repo)
    v2 = tmp_path / "v2"
    _adapter(v2 / "adapters" / "x.safetensors", 9.0)
    v2_commit = fake_hub.add_revision("ORG/REPO", "v2", v2)
    url = f"{fake_hub.endpoint}/ORG/REPO/tree/v2/adapters"
    adapter = fetch(url, weight_name="x.safetensors")
    assert (adapter.revision, adapter.commit) == ("v2", v2_commit)
    assert read_local_header(adapter.path).scalars == {"transformer_blocks.0.attn.to_q.alpha": 9.0}
    with pytest.raises(H3AppError, match="the URL names revision 'v2' but --revision says 'main'"):
        parse_source(url, weight_name="x.safetensors", revision="main")


def test_registry_identity_of_a_folder_url_is_the_file_it_names() -> None:
    from h3app.adapters.known import registry_identity

    url = "https://huggingface.co/ORG/REPO/tree/main/adapters"
    assert registry_identity(url, "x.safetensors", "x.safetensors") == ("ORG/REPO", "adapters/x.safetensors")
    assert registry_identity(url + "/sub", "x.safetensors", "x.safetensors") == (
        "ORG/REPO", "adapters/sub/x.safetensors")


def test_cli_inspect_takes_a_folder_url_and_weight_name(fake_hub: FakeHub, repo: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from cli_runner import run_cli

    fake_hub.add_repo("ORG/REPO", repo)
    code, out, err = run_cli(capsys, "inspect", "https://huggingface.co/ORG/REPO/tree/main/adapters",
                             "--weight-name", "x.safetensors", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert (info["rank"], info["alpha"], info["alpha_source"]) == (2, 2.0, "module_tensor")


def test_offline_a_folder_url_resolves_from_the_cache(fake_hub: FakeHub, repo: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from hub_server import set_offline

    fake_hub.add_repo("ORG/REPO", repo)
    url = _url(fake_hub, "tree", "main", "nest")
    online = fetch(url, weight_name="nest/z.safetensors")
    set_offline(monkeypatch, True)
    fake_hub.clear_log()
    offline = fetch(url, weight_name="nest/z.safetensors")
    assert (offline.path, offline.filename) == (online.path, "nest/nest/z.safetensors")
    assert fetch(url).filename == "nest/nest/z.safetensors"  # the folder's only cached file
    assert fake_hub.requests == []
