"""Reliability: every entry of the bad-input corpus (tests/bad_inputs.py) through the CLI and the backend.

For each bad input: the CLI exits 2 with exactly one line on stderr that names the problem (no traceback); the
backend (``inspect`` / ``load`` / ``generate``) raises ``H3AppError`` with that line; the transformer's weights are
bitwise its base afterwards (hashed, with no reset from the test in between: the backend must get back to base by
itself); and the backend keeps serving (a good load right after succeeds; a full generation after the whole corpus
gives the same hash as before it). Most CLI runs are in-process (``h3app.cli.main``); a handful are real
subprocesses. The UI's ``gr.Error`` path is tested in tests/test_reliability_ui.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bad_inputs import BadInput, corpus_entries, make_accepted, make_corpus
from cli_runner import assert_one_line, run_cli
from model_state import assert_at_base, close_server, open_server

from h3app.backend.service import Backend
from h3app.errors import H3AppError
from h3app.request import GenerationRequest
from h3app.settings import LoRASettings

ROOT = Path(__file__).resolve().parents[1]
ENTRIES = corpus_entries()
BY_KIND = {entry.kind: entry for entry in ENTRIES}

# Defects found by this corpus (reported to the lead with a proposed fix); the marker goes when the fix lands.
KNOWN_DEFECTS: dict[str, str] = {}  # kind → defect, for entries pinned as strict xfail (none open)


def kinds(*stages: str) -> list[Any]:
    """Corpus kinds of the given stages, as pytest params (known defects marked strict xfail)."""
    def marks(kind: str) -> list[Any]:
        return [pytest.mark.xfail(strict=True, reason=KNOWN_DEFECTS[kind])] if kind in KNOWN_DEFECTS else []

    return [pytest.param(e.kind, id=e.kind, marks=marks(e.kind)) for e in ENTRIES if e.stage in stages]


# ------------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def accepted(corpus_dir: Path) -> dict[str, Any]:
    return {item.kind: item for item in make_accepted(corpus_dir)}


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One backend for the whole module (as a server would be), the base weights' hash, and a reference result."""
    state = open_server(tiny_model, tmp_path_factory.mktemp("outputs"))
    yield state
    close_server(state)


@pytest.fixture
def cli_uses_loaded_model(monkeypatch: pytest.MonkeyPatch, tiny_model) -> None:
    """In-process ``generate`` builds its own Backend; hand it the session's tiny model instead of loading it again.
    A real CLI process ends after a success, taking its adapters with it; here the model is shared, so after the
    test (not before its checks) every Backend the CLI built is reset."""
    import h3app.backend.service as service

    built: list[Backend] = []
    original_init = service.Backend.__init__

    def init(self: Backend, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(service, "load_model", lambda model, workflow="t2va", options=None: tiny_model)
    monkeypatch.setattr(service.Backend, "__init__", init)
    yield
    for backend in built:
        backend.binder.reset()


def entry(kind: str, corpus_dir: Path) -> BadInput:
    return BY_KIND[kind].resolve(corpus_dir)


def settings_of(bad: BadInput) -> LoRASettings:
    return LoRASettings(source=bad.source, weight_name=bad.weight_name, revision=bad.revision, alpha=bad.alpha,
                        strength=bad.strength)


def good_settings(corpus_dir: Path) -> LoRASettings:
    return LoRASettings(source=str(corpus_dir / "good_for_settings.safetensors"), alpha=8.0)


# ------------------------------------------------------------------------------------------------------- helpers
def assert_refused(call: Any, pattern: str) -> str:
    """``call()`` raises ``H3AppError`` whose message is one line matching ``pattern``."""
    with pytest.raises(H3AppError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and message.strip() == message
    assert re.search(pattern, message, re.IGNORECASE), f"{message!r} does not name the problem ({pattern!r})"
    return message


def assert_still_serving(server: dict[str, Any], corpus_dir: Path) -> None:
    """A good job right after the bad one: load (fetch, normalise, attach) a valid adapter."""
    result = server["backend"].load(good_settings(corpus_dir))
    assert result.report.matched and result.info.num_targets == 6


# -------------------------------------------------------------------------------------------------- the corpus
def test_corpus_has_at_least_thirty_kinds_and_every_file_exists(corpus_dir: Path) -> None:
    assert len(ENTRIES) >= 30 and len(BY_KIND) == len(ENTRIES)
    written = make_corpus(corpus_dir / "again")  # the script writes the same entries every time
    assert [e.kind for e in written] == [e.kind for e in ENTRIES]
    for bad in written:
        if bad.source.startswith("/") and bad.kind not in ("local_file_missing", "hosted_system_file"):
            assert Path(bad.source).exists(), bad.kind
    assert not (corpus_dir / "missing.safetensors").exists()


@pytest.mark.slow
def test_bad_inputs_script_writes_the_corpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``python tests/bad_inputs.py OUT_DIR``'s ``main``, in this process: a child would spend ~15 s importing the
    libraries this worker already holds, and ``main`` is all its ``__main__`` block runs."""
    from bad_inputs import main

    assert main([str(tmp_path)]) == 0
    assert f"{len(ENTRIES)} bad inputs" in capsys.readouterr().out
    assert (tmp_path / "html_page.safetensors").read_bytes().startswith(b"<!DOCTYPE html>")
    assert (tmp_path / "header_200mb.safetensors").stat().st_size == 8


@pytest.mark.parametrize("kind", kinds("source", "header"))
def test_cli_inspect_refuses_in_one_line(kind: str, corpus_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = entry(kind, corpus_dir)
    code, out, err = run_cli(capsys, *bad.cli_inspect_args() + ["--model", "tiny"])
    assert code == 2, (out, err)
    assert_one_line(err, bad.expect)
    assert out == ""


@pytest.mark.parametrize("kind", kinds("load"))
def test_cli_inspect_reads_only_the_header_so_load_stage_inputs_pass_it(kind: str, corpus_dir: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    bad = entry(kind, corpus_dir)
    code, out, err = run_cli(capsys, *bad.cli_inspect_args() + ["--model", "tiny", "--json"])
    assert code == 0, err
    assert '"format"' in out


@pytest.mark.parametrize("kind", kinds("settings", "source", "header", "load"))
def test_cli_generate_refuses_in_one_line_and_leaves_the_base(kind: str, corpus_dir: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str], cli_uses_loaded_model,
                                                              at_base: dict[str, Any]) -> None:
    bad = entry(kind, corpus_dir)
    out_file = tmp_path / "out.mp4"
    argv = ["generate", "--prompt", "a fox", "--steps", "2", "--out", str(out_file), *bad.cli_adapter_args()]
    if bad.alpha is not None:
        argv.append(f"--alpha={bad.alpha}")
    if bad.strength != 1.0:
        argv.append(f"--scale={bad.strength}")
    code, out, err = run_cli(capsys, *argv)
    assert code == 2, (out, err)
    assert_one_line(err, bad.cli_expect or bad.expect)
    assert not out_file.exists()
    assert_at_base(at_base)


@pytest.mark.parametrize("kind", kinds("settings"))
def test_settings_are_refused_before_any_file_is_read(kind: str, corpus_dir: Path) -> None:
    bad = entry(kind, corpus_dir)
    assert_refused(lambda: settings_of(bad), bad.expect)


@pytest.mark.parametrize("kind", kinds("source", "header", "load"))
def test_backend_refuses_and_keeps_serving(kind: str, corpus_dir: Path, at_base: dict[str, Any]) -> None:
    backend: Backend = at_base["backend"]
    bad = entry(kind, corpus_dir)
    settings = settings_of(bad)
    request = GenerationRequest(prompt="a fox", steps=2)

    if bad.stage in ("source", "header"):
        assert_refused(lambda: backend.inspect(bad.source, bad.weight_name, bad.revision), bad.expect)
        assert_at_base(at_base)
    else:  # header only: inspect passes (it may warn)
        backend.inspect(bad.source, bad.weight_name, bad.revision)

    assert_refused(lambda: backend.load(settings), bad.expect)
    assert_at_base(at_base)

    # With a good adapter attached first, a job that names the bad one must end at base, not half-way.
    assert_still_serving(at_base, corpus_dir)
    assert_refused(lambda: backend.generate(request, [good_settings(corpus_dir), settings]), bad.expect)
    assert_at_base(at_base)
    assert_still_serving(at_base, corpus_dir)


@pytest.mark.parametrize("kind", kinds("settings"))
def test_engine_setter_refuses_bad_settings_on_an_attached_adapter(kind: str, corpus_dir: Path,
                                                                   at_base: dict[str, Any]) -> None:
    """The run-time slider path (``set_lora`` on an attached adapter) applies the same rules as the settings."""
    backend: Backend = at_base["backend"]
    bad = entry(kind, corpus_dir)
    good = good_settings(corpus_dir)
    backend.load(good)
    engine = backend.binder.engine()
    name = next(iter(engine.active()))
    before = engine.effective_scales(name)
    change = {"alpha": bad.alpha} if bad.alpha is not None else {"strength": bad.strength}
    assert_refused(lambda: engine.set_lora(name, **change), bad.expect)
    assert engine.effective_scales(name) == before


def test_accepted_inputs_apply_with_a_warning(accepted: dict[str, Any], at_base: dict[str, Any],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    backend: Backend = at_base["backend"]
    for item in accepted.values():
        info = backend.inspect(item.source)
        assert any(re.search(item.warning, w) for w in info.warnings), (item.kind, info.warnings)
        result = backend.load(LoRASettings(source=item.source))
        assert result.report.matched, item.kind
        code, out, err = run_cli(capsys, "inspect", item.source, "--model", "tiny")
        assert code == 0 and re.search(item.warning, out), (item.kind, out, err)
    zero = backend.inspect(accepted["stored_alpha_zero"].source)
    assert zero.alpha == zero.rank == 4 and zero.alpha_source == "module_tensor"


# -------------------------------------------------------------------------------------------------- hosted mode
@pytest.fixture(scope="module")
def hosted_server(tiny_model, tmp_path_factory: pytest.TempPathFactory, server: dict[str, Any]) -> dict[str, Any]:
    """A hosted-mode backend on the same model (after ``server``, so that the base hash is known) and its one allowed
    folder."""
    allowed = tmp_path_factory.mktemp("allowed_uploads")
    backend = Backend(loaded=tiny_model, hosted=True, allowed_local_dirs=[allowed],
                      output_dir=tmp_path_factory.mktemp("hosted_outputs"))
    yield {"backend": backend, "allowed": allowed}
    backend.binder.reset()
    backend.close()


@pytest.mark.parametrize("kind", kinds("hosted"))
def test_hosted_server_refuses_paths_outside_its_folders(kind: str, corpus_dir: Path, hosted_server: dict[str, Any],
                                                         at_base: dict[str, Any]) -> None:
    hosted: Backend = hosted_server["backend"]
    bad = entry(kind, corpus_dir)
    assert_refused(lambda: hosted.inspect(bad.source), bad.expect)
    assert_refused(lambda: hosted.load(settings_of(bad)), bad.expect)
    assert_refused(lambda: hosted.list_weights(str(Path(bad.source).parent)), bad.expect)
    assert_at_base(at_base)


def test_hosted_server_refuses_a_symlink_out_of_its_folders_and_accepts_a_file_inside(
        corpus_dir: Path, hosted_server: dict[str, Any], at_base: dict[str, Any]) -> None:
    hosted: Backend = hosted_server["backend"]
    allowed: Path = hosted_server["allowed"]
    link = allowed / "innocent.safetensors"
    link.unlink(missing_ok=True)
    link.symlink_to(corpus_dir / "good_for_settings.safetensors")
    assert_refused(lambda: hosted.inspect(str(link)), r"not allowed on this server")
    assert_refused(lambda: hosted.load(LoRASettings(source=str(link))), r"not allowed on this server")
    escape = allowed / os.path.relpath(corpus_dir / "good_for_settings.safetensors", allowed)  # allowed/../…
    assert ".." in escape.parts
    assert_refused(lambda: hosted.inspect(str(escape)), r"not allowed on this server")
    link.unlink()
    inside = allowed / "uploaded.safetensors"
    inside.write_bytes((corpus_dir / "good_for_settings.safetensors").read_bytes())
    assert hosted.inspect(str(inside)).num_targets == 6
    assert hosted.load(LoRASettings(source=str(inside))).report.matched
    hosted.binder.reset()
    assert_at_base(at_base)
    # Bad files inside the allowed folder are refused exactly as on a local server.
    for kind in ("html_page", "pickle_renamed_zip", "nan_weights"):
        bad = entry(kind, corpus_dir)
        copy = allowed / Path(bad.source).name
        copy.write_bytes(Path(bad.source).read_bytes())
        assert_refused(lambda copy=copy: hosted.load(LoRASettings(source=str(copy))), bad.expect)
        assert_at_base(at_base)
    dotdot = entry("weight_name_dotdot", corpus_dir)
    assert_refused(lambda: hosted.load(LoRASettings(source=str(allowed), weight_name=dotdot.weight_name)),
                   dotdot.expect)


# ------------------------------------------------------------------------------------------------ still serving
@pytest.mark.slow
def test_server_generates_the_same_result_after_the_whole_corpus(corpus_dir: Path, server: dict[str, Any]) -> None:
    """Runs last in this module: after every bad input above, a good generation gives the hash of a fresh backend."""
    backend: Backend = server["backend"]
    request = GenerationRequest(prompt="a red fox in snow", seed=3, steps=2)
    after = backend.generate(request, [good_settings(corpus_dir)]).result.hash
    fresh = Backend(loaded=backend.model, output_dir=backend.output_dir)
    try:
        backend.binder.reset()
        reference = fresh.generate(request, [good_settings(corpus_dir)]).result.hash
        fresh.binder.reset()
    finally:
        fresh.close()
    assert after == reference
    assert backend.generate(request).result.hash != reference  # the adapter did change the output


# ------------------------------------------------------------------------------------------- real subprocesses
SUBPROCESS_INSPECT = ("html_page", "pickle_renamed_raw", "header_over_100mb", "pruned_h3_lora", "repo_missing_offline")


@pytest.mark.slow
def test_real_cli_processes_exit_2_with_one_line(corpus_dir: Path, tmp_path: Path) -> None:
    """A handful through ``python -m h3app`` for real (run side by side: each pays the imports)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("HF_TOKEN", None)
    commands: dict[str, tuple[list[str], str]] = {}
    for kind in SUBPROCESS_INSPECT:
        bad = entry(kind, corpus_dir)
        commands[kind] = (bad.cli_inspect_args() + ["--model", "tiny"], bad.expect)
    nan = entry("nan_weights", corpus_dir)
    commands["generate nan_weights"] = (
        ["generate", "--prompt", "a fox", "--steps", "2", "--out", str(tmp_path / "nan.mp4"), *nan.cli_adapter_args()],
        nan.expect)
    commands["generate alpha nan"] = (
        ["generate", "--prompt", "a fox", "--steps", "2", "--out", str(tmp_path / "a.mp4"), "--adapter",
         str(corpus_dir / "good_for_settings.safetensors"), "--alpha", "nan"], BY_KIND["user_alpha_nan"].expect)
    processes = {
        name: subprocess.Popen([sys.executable, "-m", "h3app", *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        for name, (argv, _) in commands.items()
    }
    for name, process in processes.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 2, (name, out, err)
        assert_one_line(err, commands[name][1])
    assert not list(tmp_path.glob("*.mp4"))


# ---------------------------------------------------------------------------------------- found while testing

# Regression: Backend.inspect once passed weight_name/revision to read_header together with the parsed SourceRef
# (ValueError, a traceback for every `generate --adapter FOLDER_OR_REPO --weight-name F`).
def test_backend_inspect_with_a_weight_name_reads_that_file(corpus_dir: Path, at_base: dict[str, Any]) -> None:
    backend: Backend = at_base["backend"]
    info = backend.inspect(str(corpus_dir / "several_weights"), "b.safetensors")
    assert info.num_targets == 6
    assert_refused(lambda: backend.inspect(str(corpus_dir / "several_weights")), r"2 \.safetensors files")


@pytest.mark.slow
def test_cli_generate_with_a_folder_and_a_weight_name(corpus_dir: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str], cli_uses_loaded_model,
                                                      at_base: dict[str, Any]) -> None:
    out_file = tmp_path / "b.mp4"
    code, out, err = run_cli(capsys, "generate", "--prompt", "a fox", "--steps", "2", "--out", str(out_file),
                             "--adapter", str(corpus_dir / "several_weights"), "--weight-name", "b.safetensors", "--json")
    assert code == 0 and out_file.exists(), err


@pytest.mark.slow
@pytest.mark.parametrize("where", ["explicit", "stored"])
def test_an_alpha_that_overflows_the_output_is_refused_in_one_line(where: str, corpus_dir: Path, tmp_path: Path,
                                                                   at_base: dict[str, Any]) -> None:
    from bad_inputs import good_tensors
    from safetensors.torch import save_file

    if where == "explicit":  # refused when the settings are made
        def settings() -> LoRASettings:
            return LoRASettings(source=str(corpus_dir / "good_for_settings.safetensors"), alpha=1e30)
    else:  # stored: the non-finite output is refused after the run, before anything is written
        path = tmp_path / "huge_alpha.safetensors"
        save_file(good_tensors(), str(path), metadata={"lora_alpha": "1e30"})

        def settings() -> LoRASettings:
            return LoRASettings(source=str(path))
    assert_refused(lambda: at_base["backend"].generate(GenerationRequest(prompt="a fox", steps=2), [settings()]),
                   r"alpha|scale|NaN|Inf|finite")
    assert_at_base(at_base)
