"""Bugs a review found in adapter sources: folder listing rules, the size cap's unit, files trimmed away while being
read, and noticing that an attached adapter's source moved on."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hub_server import FakeHub
from test_adapters_source import write_adapter

from h3app.adapters import source as sources
from h3app.adapters.source import current_identity, fetch, implied_weight, read_header
from h3app.adapters.source.limits import MB, adapter_size_cap
from h3app.errors import H3AppError
from h3app.rules.units import format_bytes


# ---------------------------------------------------------------------------------------------------------------
# implied_weight lists a folder the way local listing does
# ---------------------------------------------------------------------------------------------------------------
def test_a_folder_with_checkpoints_keeps_the_chosen_name_and_inspects_like_load(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    write_adapter(folder / "lora.safetensors", {0: 8.0})
    write_adapter(folder / "checkpoint-100" / "lora.safetensors", {0: 4.0})

    assert [f.name for f in sources.list_weight_files(folder)] == ["checkpoint-100/lora.safetensors", "lora.safetensors"]
    name = implied_weight(str(folder), "lora.safetensors")
    assert name == "lora.safetensors"  # not the only file: the name must travel with the folder
    assert read_header(str(folder), name).scalars == {"transformer_blocks.0.attn.to_q.alpha": 8.0}
    assert fetch(str(folder), name).path == folder / "lora.safetensors"


def test_implied_weight_matches_the_suffix_in_any_case_like_listing(tmp_path: Path) -> None:
    folder = tmp_path / "upper"
    write_adapter(folder / "LoRA.SafeTensors", {0: 8.0})
    assert [f.name for f in sources.list_weight_files(folder)] == ["LoRA.SafeTensors"]
    assert implied_weight(str(folder), "LoRA.SafeTensors") is None  # the folder names exactly that file
    assert implied_weight(str(folder / "LoRA.SafeTensors"), "LoRA.SafeTensors") is None
    assert implied_weight("owner/repo", "lora.safetensors") == "lora.safetensors"
    assert implied_weight("https://huggingface.co/o/r/resolve/main/a.safetensors", "a.safetensors") == "a.safetensors"


# ---------------------------------------------------------------------------------------------------------------
# The size cap: one unit (decimal MB), as shown
# ---------------------------------------------------------------------------------------------------------------
def test_the_adapter_size_cap_is_in_decimal_megabytes_as_shown() -> None:
    assert adapter_size_cap("1.5", hosted=True) == 1_500_000
    assert format_bytes(adapter_size_cap("1.5", hosted=True)) == "1.5 MB"
    assert adapter_size_cap(None, hosted=True) == 2_000 * MB and format_bytes(2_000 * MB) == "2.0 GB"
    assert adapter_size_cap(None, hosted=False) is None
    with pytest.raises(H3AppError, match="H3APP_MAX_ADAPTER_MB"):
        adapter_size_cap("-3", hosted=True)


def test_the_server_reads_its_size_cap_in_the_unit_it_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    from h3app.backend import service

    monkeypatch.setenv("H3APP_MAX_ADAPTER_MB", "1.5")
    monkeypatch.setattr(service, "Backend", lambda *args, **kwargs: kwargs)  # the settings, not a model
    settings = service.backend_from_env("tiny")
    assert settings["max_remote_bytes"] == 1_500_000  # a "1.6 MB" file is over a "1.5 MB" cap


def test_a_file_between_the_mib_and_mb_caps_is_refused_with_the_sizes_shown(tmp_path: Path) -> None:
    path = tmp_path / "big.safetensors"
    write_adapter(path, {0: 8.0}, in_features=1 << 14, out_features=8)  # ~0.8 MB
    size = path.stat().st_size
    cap = adapter_size_cap(str((size - 1) / MB), hosted=True)
    with pytest.raises(H3AppError, match=rf"is {format_bytes(size)}, over this server's limit of {format_bytes(cap)}"):
        fetch(str(path), max_bytes=cap)


# ---------------------------------------------------------------------------------------------------------------
# The download cache trimmed while a request reads it
# ---------------------------------------------------------------------------------------------------------------
def _trim_after_download(monkeypatch: pytest.MonkeyPatch, times: int) -> list[str]:
    """Make ``hf_hub_download`` delete the snapshot it just wrote, ``times`` times (another request's trim)."""
    import huggingface_hub

    real = huggingface_hub.hf_hub_download
    trimmed: list[str] = []

    def download_then_trim(*args, **kwargs):
        path = Path(real(*args, **kwargs))
        if len(trimmed) < times:
            snapshot = next(p for p in path.parents if p.parent.name == "snapshots")
            shutil.rmtree(snapshot)
            trimmed.append(path.name)
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download_then_trim)
    return trimmed


@pytest.fixture
def config_repo(tmp_path: Path) -> Path:
    folder = tmp_path / "repo"
    write_adapter(folder / "lora.safetensors", {0: 8.0}, in_features=4096)
    (folder / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8}')
    return folder


def test_a_trimmed_adapter_config_is_downloaded_again_for_inspect(fake_hub: FakeHub, config_repo: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add_repo("me/trim", config_repo)
    trimmed = _trim_after_download(monkeypatch, times=1)
    header = read_header("me/trim")
    assert trimmed == ["adapter_config.json"] and header.adapter_config == {"r": 4, "lora_alpha": 8}


def test_a_cache_trimmed_again_and_again_is_one_clear_line(fake_hub: FakeHub, config_repo: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add_repo("me/trim", config_repo)
    _trim_after_download(monkeypatch, times=100)
    for action in (lambda: read_header("me/trim"), lambda: fetch("me/trim")):
        with pytest.raises(H3AppError, match="disappeared while it was being read") as caught:
            action()
        assert "\n" not in str(caught.value) and not isinstance(caught.value, FileNotFoundError)


def test_fetch_survives_one_trim_of_the_file_it_downloaded(fake_hub: FakeHub, config_repo: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add_repo("me/trim", config_repo)
    trimmed = _trim_after_download(monkeypatch, times=1)
    adapter = fetch("me/trim")
    assert trimmed == ["lora.safetensors"] and adapter.path.is_file() and adapter.adapter_config_path.is_file()


# ---------------------------------------------------------------------------------------------------------------
# A cheap identity: has the source moved on?
# ---------------------------------------------------------------------------------------------------------------
def test_a_rewritten_local_file_has_a_new_identity(tmp_path: Path) -> None:
    path = write_adapter(tmp_path / "lora.safetensors", {0: 8.0})
    adapter = fetch(str(path))
    assert current_identity(adapter) == adapter.identity
    write_adapter(path, {0: 8.0, 1: 4.0})
    assert current_identity(adapter) != adapter.identity
    path.unlink()
    assert current_identity(adapter) != adapter.identity


def test_a_branch_that_moved_on_has_a_new_identity_and_a_commit_pin_needs_no_request(
        fake_hub: FakeHub, config_repo: Path, tmp_path: Path) -> None:
    first = fake_hub.add_repo("me/moving", config_repo)
    adapter = fetch("me/moving")
    assert adapter.identity == sources.SourceIdentity.of_hub("me/moving", "lora.safetensors", first)
    assert current_identity(adapter) == adapter.identity
    pinned = fetch("me/moving", revision=first)

    newer = tmp_path / "newer"
    write_adapter(newer / "lora.safetensors", {0: 2.0})
    second = fake_hub.add_revision("me/moving", "main", newer, commit="b" * 40)
    assert current_identity(adapter).version == (second,) != adapter.identity.version

    fake_hub.clear_log()
    assert current_identity(pinned) == pinned.identity and fake_hub.requests == []
