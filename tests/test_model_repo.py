"""Resolving --model: tiny, local folders, and Hub repo ids offline from a local HF cache; clear errors."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from h3app.errors import H3AppError
from h3app.model import repo

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def make_hf_cache(hf_home: Path, repo_id: str, source: Path) -> Path:
    """Lay ``source`` out as huggingface_hub's cache does for ``repo_id`` at revision main."""
    owner, name = repo_id.split("/")
    base = hf_home / "hub" / f"models--{owner}--{name}"
    snapshot = base / "snapshots" / COMMIT
    shutil.copytree(source, snapshot)
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture(scope="module")
def generates(tmp_path_factory) -> dict[str, tuple[subprocess.Popen, Path]]:
    """The two real ``python -m h3app generate`` processes below, started side by side when the first of their tests
    runs (each pays the imports); each test waits for its own. Name → (process, its folder)."""
    cached, empty = tmp_path_factory.mktemp("cached"), tmp_path_factory.mktemp("not_cached")
    make_hf_cache(cached / "hf", "someone/tiny-h3-copy", repo.TINY_DIR)
    runs = {"cached": (["--model", "someone/tiny-h3-copy", "--prompt", "rain on a tin roof", "--seed", "3", "--steps",
                        "3", "--out", str(cached / "x.mp4"), "--json"], cached / "hf", cached),
            "not cached": (["--model", "someone/not-cached", "--prompt", "x", "--out", str(empty / "x.mp4")],
                           empty / "empty", empty)}
    started = {name: (subprocess.Popen([sys.executable, "-m", "h3app", "generate", *argv], cwd=ROOT, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       env={**os.environ, "HF_HOME": str(hf_home)}), folder)
               for name, (argv, hf_home, folder) in runs.items()}
    yield started
    for process, _ in started.values():
        process.kill()  # a no-op for one that ended
        process.communicate()


def finished(process: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.mark.slow
def test_repo_id_loads_offline_from_local_cache(generates):
    process, folder = generates["cached"]
    done = finished(process)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (folder / "x.mp4").is_file() and result["frames"] == 124 and result["audio_channels"] == 2


@pytest.mark.slow
def test_repo_id_offline_and_not_cached_is_one_clear_line(generates):
    process, _ = generates["not cached"]
    done = finished(process)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "someone/not-cached" in lines[0] and "cache" in lines[0]
    assert "Traceback" not in done.stderr


def test_local_folder_and_tiny_resolve_to_the_same_checkpoint():
    assert repo.locate("tiny").folder == repo.locate(str(repo.TINY_DIR)).folder


def test_not_an_h3_repo(tmp_path):
    with pytest.raises(H3AppError, match="not a MiniMax H3 repo"):
        repo.locate(str(tmp_path))
    (tmp_path / repo.INDEX_FILE).write_text(json.dumps({"_class_name": "WanPipeline"}))
    with pytest.raises(H3AppError, match="WanPipeline"):
        repo.locate(str(tmp_path))


def tiny_copy_without(tmp_path, component: str):
    """A copy of the tiny checkpoint lacking the ``component`` folder."""
    copy = tmp_path / "m"
    shutil.copytree(repo.TINY_DIR, copy)
    shutil.rmtree(copy / component)
    return copy


def test_missing_component_and_wrong_class(tmp_path):
    copy = tiny_copy_without(tmp_path, "audio_vae")
    with pytest.raises(H3AppError, match="audio_vae"):
        repo.locate(str(copy))
    index = json.loads((copy / repo.INDEX_FILE).read_text())
    shutil.copytree(repo.TINY_DIR / "audio_vae", copy / "audio_vae")
    index["vae"][1] = "AutoencoderKLWan"
    (copy / repo.INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(H3AppError, match="AutoencoderKLWan"):
        repo.locate(str(copy))


def test_ref2va_needs_transformer_ref(tmp_path):
    copy = tiny_copy_without(tmp_path, "transformer_ref")
    repo.locate(str(copy), workflow="t2va")  # t2va does not need it
    with pytest.raises(H3AppError, match="transformer_ref"):
        repo.locate(str(copy), workflow="ref2va")


def test_only_the_needed_partition_is_requested():
    assert "transformer_ref" not in repo.components_for("t2va")
    assert "transformer" not in repo.components_for("ref2va")
    assert repo.partition_for("fl2va") == "transformer"


def test_bad_model_names():
    for bad in ("nope", "a/b/c", "../etc"):
        with pytest.raises(H3AppError):
            repo.locate(bad)
