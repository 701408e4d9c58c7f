"""Adapter sources: parsing, listing, choosing, remote header preview, pinned download, offline, errors, hosted caps.

Hub behaviour is tested for real against ``tests/hub_server.py`` (a local HTTP server answering like the Hub, with
huggingface_hub pointed at it); every assertion about what was (not) downloaded reads the server's request log.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hub_server import FakeHub, _parse_range, fake_commit, point_huggingface_hub_at, set_offline
from safetensors.torch import save_file

from h3app.adapters.header import read_local_header
from h3app.adapters.source import (
    AdapterFile,
    MultipleWeightFiles,
    SourceRef,
    WeightFile,
    choose_weight,
    fetch,
    list_weight_files,
    parse_source,
    read_header,
)
from h3app.errors import H3AppError

REPO_ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------------------------
# Test adapters
# ---------------------------------------------------------------------------------------------------------------
def write_adapter(path: Path, alphas: dict[int, float], *, rank: int = 4, in_features: int = 16, out_features: int = 16,
                  dtype: torch.dtype = torch.float32, metadata: dict[str, str] | None = None, seed: int = 0) -> Path:
    """A diffusers-named LoRA: per block ``i`` in ``alphas``, to_q lora_A [rank, in], lora_B [out, rank] and an F32
    0-dim ``.alpha`` holding ``alphas[i]``."""
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for block, alpha in alphas.items():
        base = f"transformer_blocks.{block}.attn.to_q"
        tensors[f"{base}.lora_A.weight"] = torch.randn(rank, in_features, generator=generator).to(dtype)
        tensors[f"{base}.lora_B.weight"] = torch.randn(out_features, rank, generator=generator).to(dtype)
        tensors[f"{base}.alpha"] = torch.tensor(alpha, dtype=torch.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=metadata)
    return path


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def lora_repo(tmp_path: Path) -> Path:
    """A repo folder: one adapter + adapter_config.json + unrelated files that must never be downloaded."""
    folder = tmp_path / "repo_lora"
    write_adapter(folder / "lora.safetensors", {0: 8.0, 1: 8.0}, in_features=4096)  # ~130 kB: > the 100 kB header read
    (folder / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8}')
    (folder / "README.md").write_text("# a LoRA\n")
    (folder / "extra").mkdir()
    write_adapter(folder / "extra" / "unrelated.bin", {0: 1.0})  # named like a pickle: never fetched
    (folder / "extra" / "config.json").write_text("{}")
    return folder


@pytest.fixture
def multi_repo(tmp_path: Path) -> Path:
    folder = tmp_path / "repo_multi"
    write_adapter(folder / "turbo_4step.safetensors", {0: 8.0}, rank=8)
    write_adapter(folder / "v1" / "turbo_8step.safetensors", {0: 16.0}, rank=16)
    (folder / "v1" / "adapter_config.json").write_text('{"r": 16, "lora_alpha": 16}')
    (folder / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 8}')
    (folder / "notes.json").write_text('{"steps": 4}')
    return folder


# ---------------------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------------------
def test_repo_id_parses_to_a_hub_ref_with_weight_and_revision() -> None:
    assert parse_source("lightx2v/Minimax-h3-Turbo") == SourceRef("hub", repo_id="lightx2v/Minimax-h3-Turbo")
    ref = parse_source("  larryvrh/MiniMax-H3-Turbo-Lora ", weight_name="loras/a.safetensors", revision="v1.0")
    assert (ref.kind, ref.repo_id, ref.filename, ref.revision, ref.local_path) == (
        "hub", "larryvrh/MiniMax-H3-Turbo-Lora", "loras/a.safetensors", "v1.0", None)
    # Blank UI boxes mean "not given".
    assert parse_source("a/b", weight_name="  ", revision="") == SourceRef("hub", repo_id="a/b")


@pytest.mark.parametrize(
    "url, repo_id, revision, filename",
    [
        ("https://huggingface.co/lightx2v/Minimax-h3-Turbo/resolve/main/loras/fl2v_4step.safetensors?download=true",
         "lightx2v/Minimax-h3-Turbo", "main", "loras/fl2v_4step.safetensors"),
        ("https://huggingface.co/fal/MiniMax-H3-Realism-People-LoRA/blob/" + "a" * 40 + "/lora.safetensors",
         "fal/MiniMax-H3-Realism-People-LoRA", "a" * 40, "lora.safetensors"),
        ("https://hf.co/o/n/resolve/refs%2Fpr%2F3/x.safetensors", "o/n", "refs/pr/3", "x.safetensors"),
        ("https://huggingface.co/o/n/resolve/refs/pr/12/sub/x.safetensors", "o/n", "refs/pr/12", "sub/x.safetensors"),
        ("https://huggingface.co/o/n/resolve/v1.0/my%20lora.safetensors", "o/n", "v1.0", "my lora.safetensors"),
        ("https://huggingface.co/o/n", "o/n", None, None),
        ("https://huggingface.co/o/n/tree/dev", "o/n", "dev", None),
    ],
)
def test_hf_urls_give_repo_revision_and_file(url: str, repo_id: str, revision: str | None, filename: str | None) -> None:
    ref = parse_source(url)
    assert (ref.kind, ref.repo_id, ref.revision, ref.filename) == ("hub", repo_id, revision, filename)


def test_urls_on_the_configured_endpoint_are_hub_urls(fake_hub: FakeHub) -> None:
    ref = parse_source(f"{fake_hub.endpoint}/me/lora/resolve/main/lora.safetensors")
    assert (ref.repo_id, ref.revision, ref.filename) == ("me/lora", "main", "lora.safetensors")
    with pytest.raises(H3AppError, match="not a Hugging Face URL"):
        parse_source("https://civitai.com/api/download/models/12345")
    with pytest.raises(H3AppError, match="not a Hugging Face URL"):
        parse_source("http://127.0.0.1:1/me/lora/resolve/main/lora.safetensors")  # another port: another host


def test_url_must_agree_with_explicit_weight_name_and_revision() -> None:
    url = "https://huggingface.co/o/n/resolve/main/a.safetensors"
    assert parse_source(url, weight_name="a.safetensors", revision="main").filename == "a.safetensors"
    with pytest.raises(H3AppError, match="the URL names 'a.safetensors' but --weight-name says 'b.safetensors'"):
        parse_source(url, weight_name="b.safetensors")
    with pytest.raises(H3AppError, match="the URL names revision 'main' but --revision says 'dev'"):
        parse_source(url, revision="dev")


@pytest.mark.parametrize(
    "url, message",
    [
        ("https://huggingface.co/datasets/o/n/resolve/main/a.safetensors", "not a model repo URL"),
        ("https://huggingface.co/spaces/o/n", "not a model repo URL"),
        ("https://huggingface.co/o/n/commits/main", "not a file URL"),
        ("https://huggingface.co/o/n/tree/main/loras/../x", "not a plain path inside the repo"),
        ("https://huggingface.co/o/n/blob/main/loras/config.json", "does not end in .safetensors"),
        ("https://huggingface.co/o/n/resolve/main", "names no file"),
        ("https://huggingface.co/o", "names no repo"),
        ("https://huggingface.co/o/n/resolve/main/model.bin", r"pickle file \(\.bin\)"),
        ("https://huggingface.co/o/n/resolve/main/../../etc/x.safetensors", "contains '..'"),
        ("ftp://huggingface.co/o/n", "only http"),
    ],
)
def test_bad_urls_are_refused_with_the_reason(url: str, message: str) -> None:
    with pytest.raises(H3AppError, match=message):
        parse_source(url)


def test_local_file_and_folder_parse(tmp_path: Path) -> None:
    file = write_adapter(tmp_path / "adapters" / "one.safetensors", {0: 4.0})
    write_adapter(tmp_path / "adapters" / "nested" / "two.safetensors", {0: 4.0})

    ref = parse_source(str(file))
    assert (ref.kind, ref.local_path, ref.filename, ref.repo_id) == ("local", file, "one.safetensors", None)

    folder_ref = parse_source(str(tmp_path / "adapters"))
    assert (folder_ref.kind, folder_ref.local_path, folder_ref.filename) == ("local", tmp_path / "adapters", None)

    chosen = parse_source(str(tmp_path / "adapters"), weight_name="nested/two.safetensors")
    assert chosen.local_path == tmp_path / "adapters" / "nested" / "two.safetensors"
    assert chosen.filename == "nested/two.safetensors"

    with pytest.raises(H3AppError, match=r"missing\.safetensors is not in folder .*: nested/two\.safetensors \(\d+ B\), one\.safetensors"):
        parse_source(str(tmp_path / "adapters"), weight_name="missing.safetensors")
    with pytest.raises(H3AppError, match="--revision applies to Hub sources"):
        parse_source(str(file), revision="main")
    with pytest.raises(H3AppError, match="already a file"):
        parse_source(str(file), weight_name="other.safetensors")
    with pytest.raises(H3AppError, match="does not exist"):
        parse_source(str(tmp_path / "nowhere" / "x.safetensors"))
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(H3AppError, match="not a .safetensors file"):
        parse_source(str(tmp_path / "notes.txt"))


def test_relative_local_paths_win_over_repo_ids_when_they_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_adapter(tmp_path / "owner" / "name" / "a.safetensors", {0: 1.0})
    monkeypatch.chdir(tmp_path)
    assert parse_source("owner/name").kind == "local"
    assert parse_source("other/name").kind == "hub"


@pytest.mark.parametrize(
    "repo_id, message",
    [
        ("owner/na--me", "not a valid Hub repo id"),
        ("owner/name.git", "not a valid Hub repo id"),
        ("-owner/name", "not a valid Hub repo id"),
        ("owner/", "not a valid Hub repo id"),
        ("owner/na me", "not a valid Hub repo id"),
        ("owner/" + "n" * 100, "not a valid Hub repo id"),
        ("justaname", "not a Hub repo id, nor an existing local path"),
        ("a/b/c", "a/b/c is neither an existing local path nor a Hub repo id"),
        ("not/a/repo!!", r"not/a/repo!! is neither an existing local path nor a Hub repo id"),  # not "local path"
        ("./a/b.safetensors", "local path ./a/b.safetensors does not exist"),
    ],
)
def test_malformed_repo_ids_are_refused(repo_id: str, message: str) -> None:
    with pytest.raises(H3AppError, match=message) as caught:
        parse_source(repo_id)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "weight_name, message",
    [
        ("../secret.safetensors", "contains '..'"),
        ("loras/../../x.safetensors", "contains '..'"),
        ("/etc/x.safetensors", "absolute path"),
        ("C:/x.safetensors", "absolute path"),
        ("~/x.safetensors", "absolute path"),
        ("loras\\x.safetensors", "backslash"),
        ("loras//x.safetensors", "empty or '.' folder part"),
        ("./x.safetensors", "empty or '.' folder part"),
        ("x\x00.safetensors", "control characters"),
        ("readme.md", "does not end in .safetensors"),
    ],
)
def test_traversal_absolute_and_odd_weight_names_are_refused(weight_name: str, message: str) -> None:
    with pytest.raises(H3AppError, match=message):
        parse_source("owner/name", weight_name=weight_name)


def test_traversal_out_of_a_local_folder_is_refused_even_when_the_target_exists(tmp_path: Path) -> None:
    write_adapter(tmp_path / "secret.safetensors", {0: 1.0})
    (tmp_path / "folder").mkdir()
    with pytest.raises(H3AppError, match="contains '..'"):
        parse_source(str(tmp_path / "folder"), weight_name="../secret.safetensors")


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".ckpt", ".pth"])
def test_pickle_names_are_refused_everywhere(tmp_path: Path, suffix: str) -> None:
    with pytest.raises(H3AppError, match=rf"pickle file \({suffix}\): pickles can run code"):
        parse_source("owner/name", weight_name=f"adapter{suffix}")
    pickle_file = tmp_path / f"adapter{suffix}"
    pickle_file.write_bytes(b"\x80\x04not really")
    with pytest.raises(H3AppError, match="pickles can run code"):
        parse_source(str(pickle_file))
    with pytest.raises(H3AppError, match="pickles can run code"):
        parse_source(f"https://huggingface.co/o/n/resolve/main/adapter{suffix}")


@pytest.mark.parametrize("revision", ["main..dev", "a b", "-x", "dev/", "topic.lock", "x@{1}", "a" * 256])
def test_bad_revisions_are_refused(revision: str) -> None:
    with pytest.raises(H3AppError, match="is not a valid branch, tag or commit"):
        parse_source("owner/name", revision=revision)


# ---------------------------------------------------------------------------------------------------------------
# Choosing
# ---------------------------------------------------------------------------------------------------------------
def test_choose_weight_rules() -> None:
    one = [WeightFile("a.safetensors", 1_234_567), WeightFile("README.md", 10)]
    assert choose_weight(one) == WeightFile("a.safetensors", 1_234_567)

    several = [WeightFile("a.safetensors", 1_234_567), WeightFile("b/c.safetensors", 300)]
    with pytest.raises(MultipleWeightFiles) as caught:
        choose_weight(several, where="Hub repo o/n")
    assert caught.value.files == tuple(several)
    assert isinstance(caught.value, H3AppError)
    assert str(caught.value) == (
        "Hub repo o/n has 2 .safetensors files: a.safetensors (1.2 MB), b/c.safetensors (300 B); choose one with "
        "--weight-name (e.g. --weight-name a.safetensors)."
    )
    assert choose_weight(several, "b/c.safetensors").size == 300
    with pytest.raises(H3AppError, match=r"d\.safetensors is not in Hub repo o/n; its .safetensors files: a\.safetensors \(1\.2 MB\)"):
        choose_weight(several, "d.safetensors", where="Hub repo o/n")
    with pytest.raises(H3AppError, match="has no .safetensors file"):
        choose_weight([WeightFile("model.bin", 5)], where="Hub repo o/n")


# ---------------------------------------------------------------------------------------------------------------
# Local sources
# ---------------------------------------------------------------------------------------------------------------
def test_local_read_header_and_fetch(tmp_path: Path) -> None:
    folder = tmp_path / "local"
    file = write_adapter(folder / "a.safetensors", {0: 2.5}, metadata={"ss_network_alpha": "4"})
    (folder / "adapter_config.json").write_text('{"lora_alpha": 3}')

    assert read_header(str(file)) == read_local_header(file)
    assert read_header(str(folder)).scalars == {"transformer_blocks.0.attn.to_q.alpha": 2.5}
    assert list_weight_files(str(folder)) == [WeightFile("a.safetensors", file.stat().st_size)]

    calls: list[tuple[int, int | None]] = []
    adapter = fetch(str(folder), progress=lambda done, total: calls.append((done, total)))
    assert adapter.path == file and adapter.filename == "a.safetensors" and adapter.size == file.stat().st_size
    assert adapter.adapter_config_path == folder / "adapter_config.json"
    assert (adapter.repo_id, adapter.revision, adapter.commit) == (None, None, None)
    assert adapter.sha256() == sha256_of(file)
    assert calls == [(adapter.size, adapter.size)]

    write_adapter(folder / "b.safetensors", {0: 1.0})
    with pytest.raises(MultipleWeightFiles) as caught:
        fetch(str(folder))
    assert [f.name for f in caught.value.files] == ["a.safetensors", "b.safetensors"]


def test_sha256_is_streamed_once_and_cached(tmp_path: Path) -> None:
    file = write_adapter(tmp_path / "a.safetensors", {0: 1.0})
    adapter = fetch(str(file))
    first = adapter.sha256()
    assert first == sha256_of(file)
    file.write_bytes(b"changed after hashing")
    assert adapter.sha256() == first  # cached on the object: the file is not read again
    assert fetch(str(file)).sha256() == hashlib.sha256(b"changed after hashing").hexdigest() != first


# ---------------------------------------------------------------------------------------------------------------
# Hub: listing, choosing, header preview
# ---------------------------------------------------------------------------------------------------------------
def test_listing_gives_safetensors_files_with_sizes(fake_hub: FakeHub, multi_repo: Path) -> None:
    fake_hub.add_repo("me/multi", multi_repo)
    files = list_weight_files("me/multi")
    assert files == [
        WeightFile("turbo_4step.safetensors", (multi_repo / "turbo_4step.safetensors").stat().st_size),
        WeightFile("v1/turbo_8step.safetensors", (multi_repo / "v1" / "turbo_8step.safetensors").stat().st_size),
    ]
    assert [r.path for r in fake_hub.requests if r.path.startswith("/api/models")] == ["/api/models/me/multi"]
    assert "blobs=true" in [r.query for r in fake_hub.requests if r.path == "/api/models/me/multi"][0]


def test_several_safetensors_without_a_name_ask_for_a_choice_and_download_nothing(fake_hub: FakeHub, multi_repo: Path) -> None:
    fake_hub.add_repo("me/multi", multi_repo)
    for call in (fetch, read_header):
        with pytest.raises(MultipleWeightFiles) as caught:
            call("me/multi")
        assert [f.name for f in caught.value.files] == ["turbo_4step.safetensors", "v1/turbo_8step.safetensors"]
        assert "--weight-name" in str(caught.value) and "Hub repo me/multi" in str(caught.value)
    assert fake_hub.downloaded_files("me/multi") == set()


def test_one_safetensors_is_taken_without_a_name(fake_hub: FakeHub, lora_repo: Path) -> None:
    fake_hub.add_repo("me/lora", lora_repo)
    adapter = fetch("me/lora")
    assert adapter.filename == "lora.safetensors"
    assert adapter.sha256() == sha256_of(lora_repo / "lora.safetensors")


def test_remote_header_preview_reads_shapes_and_alphas_with_range_requests_only(fake_hub: FakeHub, tmp_path: Path) -> None:
    folder = tmp_path / "repo_bf16"
    # BF16 weights with F32 alphas: safetensors stores the F32 scalars first, right after the header.
    local = write_adapter(folder / "loras" / "turbo.safetensors", {0: 8.0, 1: 0.5, 2: 16.0}, rank=8,
                          in_features=4096, dtype=torch.bfloat16, metadata={"lora_adapter_metadata": '{"r": 8}'})
    (folder / "loras" / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 8, "use_rslora": false}')
    commit = fake_hub.add_repo("me/bf16", folder)

    header = read_header("me/bf16", weight_name="loras/turbo.safetensors")

    assert header == read_local_header(local)  # the remote preview sees exactly what the local reader sees
    assert header.tensors["transformer_blocks.1.attn.to_q.lora_A.weight"] == ("BF16", (8, 4096))
    assert header.tensors["transformer_blocks.1.attn.to_q.lora_B.weight"] == ("BF16", (16, 8))
    assert header.scalars == {
        "transformer_blocks.0.attn.to_q.alpha": 8.0,
        "transformer_blocks.1.attn.to_q.alpha": 0.5,
        "transformer_blocks.2.attn.to_q.alpha": 16.0,
    }
    assert header.metadata == {"lora_adapter_metadata": '{"r": 8}'}
    assert header.adapter_config == {"r": 8, "lora_alpha": 8, "use_rslora": False}
    assert header.file_bytes == local.stat().st_size and header.name == "turbo.safetensors"

    weight_requests = fake_hub.requests_for("me/bf16", "loras/turbo.safetensors")
    assert weight_requests and all(r.method == "GET" and r.range and r.status == 206 for r in weight_requests)
    assert not any(r.is_full_get for r in weight_requests)
    assert sum(r.sent_bytes for r in weight_requests) < local.stat().st_size
    assert all(f"/resolve/{commit}/" in r.path for r in weight_requests)  # pinned to the listed commit
    scalar_reads = [r for r in weight_requests if r.range != "bytes=0-100000"]
    assert len(scalar_reads) == 1  # length prefix + the three adjacent alphas in one request


def test_remote_scalars_spread_through_the_file_are_read_in_separate_small_ranges(fake_hub: FakeHub, tmp_path: Path) -> None:
    folder = tmp_path / "repo_f32"
    # All F32: keys sort as alpha, lora_A, lora_B per block, so 256 kB of weights lie between consecutive alphas.
    local = write_adapter(folder / "spread.safetensors", {0: 4.0, 1: 12.0, 2: 0.25}, rank=8, in_features=8192)
    fake_hub.add_repo("me/f32", folder)

    header = read_header("me/f32")

    assert header.scalars == read_local_header(local).scalars == {
        "transformer_blocks.0.attn.to_q.alpha": 4.0,
        "transformer_blocks.1.attn.to_q.alpha": 12.0,
        "transformer_blocks.2.attn.to_q.alpha": 0.25,
    }
    assert header.adapter_config is None
    weight_requests = fake_hub.requests_for("me/f32", "spread.safetensors")
    assert not any(r.is_full_get for r in weight_requests)
    assert sum(r.sent_bytes for r in weight_requests) < local.stat().st_size // 5
    scalar_reads = [r for r in weight_requests if r.range != "bytes=0-100000"]
    assert len(scalar_reads) >= 3 and all(r.sent_bytes <= 100_008 for r in scalar_reads)


def test_remote_header_larger_than_the_first_read_still_locates_the_scalars(fake_hub: FakeHub, tmp_path: Path) -> None:
    folder = tmp_path / "repo_big_header"
    # 150 kB of metadata: huggingface_hub needs a second Range read for the header; the data starts past 150 kB.
    local = write_adapter(folder / "lora.safetensors", {0: 6.0, 3: 1.5}, in_features=4096,
                          metadata={"ss_tag_frequency": "x" * 150_000})
    fake_hub.add_repo("me/big", folder)
    header = read_header("me/big")
    assert header == read_local_header(local)
    assert header.scalars == {"transformer_blocks.0.attn.to_q.alpha": 6.0, "transformer_blocks.3.attn.to_q.alpha": 1.5}
    assert not any(r.is_full_get for r in fake_hub.requests_for("me/big", "lora.safetensors"))


def test_remote_header_of_a_truncated_file_is_refused(fake_hub: FakeHub, tmp_path: Path) -> None:
    folder = tmp_path / "repo_cut"
    whole = write_adapter(tmp_path / "whole.safetensors", {0: 8.0}, in_features=4096).read_bytes()
    folder.mkdir()
    (folder / "cut.safetensors").write_bytes(whole[: len(whole) - 1000])
    fake_hub.add_repo("me/cut", folder)
    with pytest.raises(H3AppError, match=r"me/cut/cut\.safetensors is truncated"):
        read_header("me/cut")
    with pytest.raises(H3AppError, match="truncated"):
        read_local_header(folder / "cut.safetensors")  # the same verdict as the local reader


def test_remote_header_of_an_html_page_is_refused(fake_hub: FakeHub, tmp_path: Path) -> None:
    folder = tmp_path / "repo_html"
    folder.mkdir()
    (folder / "lora.safetensors").write_text("<!DOCTYPE html><html><body>Sign in</body></html>")
    fake_hub.add_repo("me/html", folder)
    with pytest.raises(H3AppError, match=r"me/html/lora\.safetensors is an HTML page"):
        read_header("me/html")


# ---------------------------------------------------------------------------------------------------------------
# Hub: download
# ---------------------------------------------------------------------------------------------------------------
def test_pinned_download_fetches_only_the_file_and_its_json_sidecars(fake_hub: FakeHub, multi_repo: Path, tmp_path: Path) -> None:
    commit = fake_hub.add_repo("me/multi", multi_repo)
    adapter = fetch("me/multi", weight_name="turbo_4step.safetensors")

    assert fake_hub.downloaded_files("me/multi") == {"turbo_4step.safetensors", "adapter_config.json", "notes.json"}
    assert not any(r.range for r in fake_hub.requests if r.method == "GET" and "/resolve/" in r.path)
    assert (adapter.repo_id, adapter.revision, adapter.commit) == ("me/multi", "main", commit)
    assert adapter.filename == "turbo_4step.safetensors"
    assert adapter.path == tmp_path / "hf_home" / "hub" / "models--me--multi" / "snapshots" / commit / "turbo_4step.safetensors"
    assert adapter.sha256() == sha256_of(multi_repo / "turbo_4step.safetensors")
    assert adapter.size == (multi_repo / "turbo_4step.safetensors").stat().st_size
    assert adapter.adapter_config_path is not None and adapter.adapter_config_path.read_text() == '{"r": 8, "lora_alpha": 8}'
    assert sorted(p.name for p in adapter.sidecar_paths) == ["adapter_config.json", "notes.json"]


def test_weight_in_a_subfolder_takes_the_sidecars_of_that_folder(fake_hub: FakeHub, multi_repo: Path) -> None:
    fake_hub.add_repo("me/multi", multi_repo)
    adapter = fetch("me/multi", weight_name="v1/turbo_8step.safetensors")
    assert fake_hub.downloaded_files("me/multi") == {"v1/turbo_8step.safetensors", "v1/adapter_config.json"}
    assert adapter.adapter_config_path.read_text() == '{"r": 16, "lora_alpha": 16}'
    assert adapter.adapter_config_path.parent == adapter.path.parent


def test_url_sources_download_through_the_configured_endpoint(fake_hub: FakeHub, lora_repo: Path) -> None:
    fake_hub.add_repo("me/lora", lora_repo)
    for url in (f"{fake_hub.endpoint}/me/lora/resolve/main/lora.safetensors",
                "https://huggingface.co/me/lora/blob/main/lora.safetensors"):
        adapter = fetch(url)
        assert (adapter.repo_id, adapter.filename, adapter.revision) == ("me/lora", "lora.safetensors", "main")
        assert adapter.sha256() == sha256_of(lora_repo / "lora.safetensors")


def test_revision_and_commit_are_pinned(fake_hub: FakeHub, lora_repo: Path, tmp_path: Path) -> None:
    main_commit = fake_hub.add_repo("me/lora", lora_repo)
    v2 = tmp_path / "repo_v2"
    write_adapter(v2 / "lora.safetensors", {0: 32.0}, seed=7)
    v2_commit = fake_hub.add_revision("me/lora", "v2", v2)

    tagged = fetch("me/lora", revision="v2")
    assert (tagged.revision, tagged.commit) == ("v2", v2_commit)
    assert tagged.sha256() == sha256_of(v2 / "lora.safetensors") != sha256_of(lora_repo / "lora.safetensors")
    by_sha = fetch("me/lora", revision=main_commit)
    assert by_sha.commit == main_commit and by_sha.sha256() == sha256_of(lora_repo / "lora.safetensors")
    assert read_header("me/lora", revision="v2").scalars == {"transformer_blocks.0.attn.to_q.alpha": 32.0}


def test_progress_callback_reports_bytes(fake_hub: FakeHub, lora_repo: Path) -> None:
    fake_hub.add_repo("me/lora", lora_repo)
    calls: list[tuple[int, int | None]] = []
    adapter = fetch("me/lora", progress=lambda done, total: calls.append((done, total)))
    assert len(calls) >= 2  # during the download (tqdm hook) and once at the end
    assert calls[-1] == (adapter.size, adapter.size)
    assert all(total == adapter.size for _, total in calls)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_offline_uses_the_cache_and_makes_no_request(fake_hub: FakeHub, lora_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commit = fake_hub.add_repo("me/lora", lora_repo)
    online = fetch("me/lora", weight_name="lora.safetensors")
    set_offline(monkeypatch, True)
    fake_hub.clear_log()

    offline = fetch("me/lora")
    assert (offline.path, offline.commit, offline.adapter_config_path) == (online.path, commit, online.adapter_config_path)
    assert read_header("me/lora", weight_name="lora.safetensors") == read_local_header(online.path)
    assert list_weight_files("me/lora") == [WeightFile("lora.safetensors", online.size)]
    assert fetch("me/lora", revision=commit).path == online.path
    assert fake_hub.requests == []


def test_offline_and_not_cached_is_a_clear_error(fake_hub: FakeHub, lora_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add_repo("me/lora", lora_repo)
    fetch("me/lora")  # cache main
    set_offline(monkeypatch, True)
    fake_hub.clear_log()
    cases = [
        (lambda: fetch("me/other", weight_name="a.safetensors"), "me/other/a.safetensors"),
        (lambda: read_header("me/other"), "Hub repo me/other"),
        (lambda: list_weight_files("me/other"), "Hub repo me/other"),
        (lambda: fetch("me/lora", weight_name="nope.safetensors"), "me/lora/nope.safetensors"),
        (lambda: fetch("me/lora", revision="v2"), r"Hub repo me/lora \(revision v2\)"),
    ]
    for call, what in cases:
        with pytest.raises(H3AppError, match=rf"{what}.* is not in the local cache and HF_HUB_OFFLINE=1: unset HF_HUB_OFFLINE"):
            call()
    assert fake_hub.requests == []


def test_repo_not_found(fake_hub: FakeHub) -> None:
    with pytest.raises(H3AppError, match="Hub repo me/missing was not found .*set HF_TOKEN"):
        fetch("me/missing", weight_name="a.safetensors")
    with pytest.raises(H3AppError, match="Hub repo me/missing was not found"):
        read_header("me/missing")


def test_file_not_found_lists_the_available_files(fake_hub: FakeHub, multi_repo: Path) -> None:
    fake_hub.add_repo("me/multi", multi_repo)
    size = (multi_repo / "turbo_4step.safetensors").stat().st_size
    expected = (rf"nope\.safetensors is not in Hub repo me/multi; its .safetensors files: "
                rf"turbo_4step\.safetensors \({size / 1000:.1f} kB\), v1/turbo_8step\.safetensors")
    with pytest.raises(H3AppError, match=expected):
        fetch("me/multi", weight_name="nope.safetensors")
    with pytest.raises(H3AppError, match=expected):
        read_header("me/multi", weight_name="nope.safetensors")
    assert fake_hub.downloaded_files("me/multi") == set()


def test_revision_not_found(fake_hub: FakeHub, lora_repo: Path) -> None:
    fake_hub.add_repo("me/lora", lora_repo)
    with pytest.raises(H3AppError, match="revision 'v9' does not exist in Hub repo me/lora"):
        fetch("me/lora", revision="v9")
    with pytest.raises(H3AppError, match="revision 'v9' does not exist in Hub repo me/lora"):
        read_header("https://huggingface.co/me/lora/resolve/v9/lora.safetensors")


def test_gated_repo_needs_a_token(fake_hub: FakeHub, lora_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add_repo("me/gated", lora_repo, gated_token="hf_accepted")
    for call in (lambda: fetch("me/gated"), lambda: read_header("me/gated")):
        with pytest.raises(H3AppError, match=r"Hub repo me/gated is gated and no token was given for me/gated/lora\.safetensors: "
                                             r"accept its terms at .*, then set HF_TOKEN or paste a token\."):
            call()
    with pytest.raises(H3AppError, match="the token given has no access to me/gated/lora.safetensors"):
        fetch("me/gated", token="hf_someone_else")
    assert fake_hub.downloaded_files("me/gated") <= {"lora.safetensors"}
    assert not [r for r in fake_hub.requests_for("me/gated", "lora.safetensors") if r.status == 200]

    header = read_header("me/gated", token="hf_accepted")
    assert header.scalars == {"transformer_blocks.0.attn.to_q.alpha": 8.0, "transformer_blocks.1.attn.to_q.alpha": 8.0}
    assert fetch("me/gated", token=" hf_accepted ").sha256() == sha256_of(lora_repo / "lora.safetensors")
    monkeypatch.setenv("HF_TOKEN", "hf_accepted")  # HF_TOKEN is honoured when no token is passed
    assert fetch("me/gated", weight_name="lora.safetensors").commit == fake_commit("me/gated")
    with pytest.raises(H3AppError, match="no token was given"):  # token=False (hosted mode): never the server's own
        read_header("me/gated", weight_name="lora.safetensors", token=False)


def test_network_failure_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeHub() as gone:
        endpoint = gone.endpoint
    point_huggingface_hub_at(monkeypatch, endpoint, tmp_path / "hf_home")
    with pytest.raises(H3AppError, match=rf"could not get Hub repo me/lora from {endpoint} \(ConnectError") as caught:
        fetch("me/lora", weight_name="lora.safetensors")
    assert "check the network connection" in str(caught.value)


# ---------------------------------------------------------------------------------------------------------------
# Hosted mode
# ---------------------------------------------------------------------------------------------------------------
def test_hosted_mode_allows_only_local_paths_inside_the_allowed_folders(tmp_path: Path) -> None:
    uploads = tmp_path / "uploads"
    inside = write_adapter(uploads / "ok.safetensors", {0: 1.0})
    outside = write_adapter(tmp_path / "private" / "secret.safetensors", {0: 1.0})
    (uploads / "link.safetensors").symlink_to(outside)
    (uploads / "linked_folder").symlink_to(outside.parent, target_is_directory=True)
    allowed = [uploads]

    assert fetch(str(inside), allowed_local_dirs=allowed).path == inside
    assert read_header(str(inside), allowed_local_dirs=allowed).file_bytes == inside.stat().st_size
    refused = [
        lambda: fetch(str(outside), allowed_local_dirs=allowed),
        lambda: fetch(str(uploads / "link.safetensors"), allowed_local_dirs=allowed),
        lambda: fetch(str(uploads / "linked_folder"), allowed_local_dirs=allowed),
        lambda: fetch(str(uploads / ".." / "private" / "secret.safetensors"), allowed_local_dirs=allowed),
        lambda: read_header(str(outside), allowed_local_dirs=allowed),
        lambda: list_weight_files(str(outside.parent), allowed_local_dirs=allowed),
        lambda: fetch(str(tmp_path / "private" / "missing.safetensors"), allowed_local_dirs=allowed),
    ]
    for call in refused:
        with pytest.raises(H3AppError, match="is not allowed on this server .*upload the file"):
            call()
    with pytest.raises(H3AppError, match="is not allowed on this server"):
        fetch(str(inside), allowed_local_dirs=[])


def test_hosted_mode_reads_repo_id_like_text_outside_the_allowed_folders_as_a_repo_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_adapter(tmp_path / "owner" / "name" / "a.safetensors", {0: 1.0})
    write_adapter(tmp_path / "uploads" / "mine" / "b.safetensors", {0: 1.0})
    monkeypatch.chdir(tmp_path)
    allowed = [tmp_path / "uploads"]
    assert parse_source("owner/name").kind == "local"  # not hosted: the existing folder wins
    assert parse_source("owner/name", allowed_local_dirs=allowed) == SourceRef("hub", repo_id="owner/name")
    assert parse_source("uploads/mine", allowed_local_dirs=allowed).local_path == tmp_path / "uploads" / "mine"


def test_hosted_mode_caps_the_size_before_downloading(fake_hub: FakeHub, lora_repo: Path, tmp_path: Path) -> None:
    fake_hub.add_repo("me/lora", lora_repo)
    size = (lora_repo / "lora.safetensors").stat().st_size
    with pytest.raises(H3AppError, match=rf"me/lora/lora\.safetensors is {size / 1000:.1f} kB, over this server's limit of 100\.0 kB"):
        fetch("me/lora", max_bytes=100_000)
    assert fake_hub.downloaded_files("me/lora") == set()  # refused from the listing's size, nothing fetched

    assert fetch("me/lora", max_bytes=size).size == size
    with pytest.raises(H3AppError, match="over this server's limit"):
        fetch(str(lora_repo / "lora.safetensors"), max_bytes=size - 1)


# ---------------------------------------------------------------------------------------------------------------
# Interrupted downloads
# ---------------------------------------------------------------------------------------------------------------
def test_interrupted_download_leaves_nothing_that_is_later_trusted(fake_hub: FakeHub, lora_repo: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add_repo("me/lora", lora_repo)
    fake_hub.interrupt_download("lora.safetensors", then="fail")
    with pytest.raises(H3AppError, match=r"me/lora/lora\.safetensors.*nothing partial was kept"):
        fetch("me/lora", weight_name="lora.safetensors")
    cut = [r for r in fake_hub.requests_for("me/lora", "lora.safetensors") if r.interrupted]
    assert len(cut) == 1 and 0 < cut[0].sent_bytes < (lora_repo / "lora.safetensors").stat().st_size

    hf_home = tmp_path / "hf_home"
    assert list(hf_home.rglob("*.incomplete")) == []
    blobs = hf_home / "hub" / "models--me--lora" / "blobs"
    assert not (blobs / sha256_of(lora_repo / "lora.safetensors")).exists()

    set_offline(monkeypatch, True)  # the half file must not be found later
    with pytest.raises(H3AppError, match="not in the local cache and HF_HUB_OFFLINE=1"):
        fetch("me/lora", weight_name="lora.safetensors")

    set_offline(monkeypatch, False)
    fake_hub.clear_interruptions()
    assert fetch("me/lora", weight_name="lora.safetensors").sha256() == sha256_of(lora_repo / "lora.safetensors")


def test_interrupted_download_resumes_to_the_right_bytes(fake_hub: FakeHub, lora_repo: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    # huggingface_hub writes 10 MB chunks and resumes from the last whole chunk; small chunks make this small file
    # resume mid-way with a Range request, the path worth testing.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1000)
    fake_hub.add_repo("me/lora", lora_repo)
    fake_hub.interrupt_download("lora.safetensors", after_bytes=5000, then="resume")
    adapter = fetch("me/lora", weight_name="lora.safetensors")
    assert adapter.sha256() == sha256_of(lora_repo / "lora.safetensors")
    gets = [r for r in fake_hub.requests_for("me/lora", "lora.safetensors") if r.method == "GET"]
    assert gets[0].interrupted and gets[0].sent_bytes == 5000
    assert gets[1].range == "bytes=5000-" and gets[1].status == 206


# ---------------------------------------------------------------------------------------------------------------
# The fake Hub itself, and the subprocess route
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "header, expected",
    [("bytes=0-99", (0, 99)), ("bytes=10-", (10, 999)), ("bytes=-100", (900, 999)), ("bytes=990-5000", (990, 999)),
     ("bytes=1000-", None), ("bytes=5-4", None), ("bytes=0-1,5-6", None), ("items=0-1", None)],
)
def test_fake_hub_range_parsing(header: str, expected: tuple[int, int] | None) -> None:
    assert _parse_range(header, 1000) == expected


@pytest.mark.slow
def test_subprocess_reaches_the_fake_hub_through_environment_variables(fake_hub: FakeHub, lora_repo: Path, tmp_path: Path) -> None:
    commit = fake_hub.add_repo("me/lora", lora_repo)
    script = textwrap.dedent("""
        from h3app.adapters.source import fetch
        adapter = fetch("me/lora")
        print(adapter.commit, adapter.sha256())
    """)
    env = fake_hub.subprocess_env(tmp_path / "hf_sub")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [commit, sha256_of(lora_repo / "lora.safetensors")]
    assert (tmp_path / "hf_sub" / "hub" / "models--me--lora" / "snapshots" / commit / "lora.safetensors").exists()


def test_adapter_file_is_a_frozen_value(tmp_path: Path) -> None:
    adapter = fetch(str(write_adapter(tmp_path / "a.safetensors", {0: 1.0})))
    assert isinstance(adapter, AdapterFile)
    with pytest.raises(AttributeError):
        adapter.size = 0  # type: ignore[misc]
    assert Path(adapter) == adapter.path == tmp_path / "a.safetensors"  # os.PathLike: usable wherever a path is
