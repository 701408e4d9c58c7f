"""`python -m h3app inspect` and `python -m h3app export`: the documented contracts (docs/adapters.md) (JSON on stdout, exit 2 with one
line on stderr for bad input)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from adapter_fixtures import (
    TINY_SHAPES,
    delta,
    diffusers_targets,
    lightx2v_full_size_entries,
    native_block,
    relative_error,
    save,
    write_sparse_safetensors,
)
from cli_runner import run_cli, run_cli_process

REPO = Path(__file__).resolve().parents[1]


def test_inspect_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save(tmp_path / "a.safetensors", native_block("diffusion_model.", 0, rank=4), {"ss_network_alpha": "2"})
    code, out, err = run_cli(capsys, "inspect", str(path), "--json")
    assert code == 0 and err == ""
    info = json.loads(out)
    assert info["format"] == "native" and info["num_targets"] == 7 and info["rank"] == 4
    assert info["alpha_source"] == "rank_fallback" and info["hints"] == {"ss_network_alpha": 2.0}
    code, out, _ = run_cli(capsys, "inspect", str(path), "--model", "tiny", "--json")
    assert code == 0 and not any("does not fit" in w for w in json.loads(out)["warnings"])


def test_inspect_human_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save(tmp_path / "a.safetensors", diffusers_targets("transformer."), {"alpha": "2"})
    code, out, _ = run_cli(capsys, "inspect", str(path), "--model", "tiny")
    assert code == 0
    assert "format       peft (lora_A/B, prefix 'transformer.')" in out
    assert "alpha        2.0 (metadata)" in out and f"targets      {len(TINY_SHAPES.linears)}" in out


def test_inspect_folder_and_weight_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save(tmp_path / "one.safetensors", native_block("", 0))
    save(tmp_path / "two.safetensors", native_block("", 1))
    code, _, err = run_cli(capsys, "inspect", str(tmp_path), "--json")
    assert code == 2 and err.count("\n") == 1 and "choose one with --weight-name" in err
    code, out, _ = run_cli(capsys, "inspect", str(tmp_path), "--weight-name", "two.safetensors", "--json")
    assert code == 0 and "transformer_blocks.1.attn.to_q" in json.loads(out)["targets"]


def _pickle_file(folder: Path) -> Path:
    (folder / "a.bin").write_bytes(b"x")
    return folder / "a.bin"


def _empty_file(folder: Path) -> Path:
    (folder / "e.safetensors").write_bytes(b"")
    return folder / "e.safetensors"


def _full_size_file(folder: Path) -> Path:
    entries = {k: v for k, v in lightx2v_full_size_entries(4).items() if ".0." in k}
    return write_sparse_safetensors(folder / "big.safetensors", entries)


@pytest.mark.parametrize(
    "make, fragment",
    [(_pickle_file, "pickle"), (_empty_file, "is empty"), (_full_size_file, "does not fit the model in use")],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], make, fragment: str) -> None:
    path = make(tmp_path)
    code, out, err = run_cli(capsys, "inspect", str(path), "--model", "tiny", "--json")
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err


def test_export_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = save(tmp_path / "src.safetensors", native_block("", 0, rank=4))
    out_dir = tmp_path / "exported"
    code, out, err = run_cli(capsys, "export", "--adapter", str(source), "--model", "tiny", "--alpha", "2",
                             "--scale", "0.5", "--out", str(out_dir), "--json")
    assert code == 0, err
    payload = json.loads(out)
    assert payload["num_targets"] == 7 and payload["strength"] == 0.5 and payload["r"] == 4
    assert payload["lora_alpha"] == 1.0  # alpha 2 × strength 0.5 / rank 4 = 0.25 per unit, × r 4
    assert (out_dir / "adapter_model.safetensors").is_file() and (out_dir / "adapter_config.json").is_file()

    from h3app.adapters.normalise import load_adapter

    original = load_adapter(source, shapes=TINY_SHAPES, explicit_alpha=2.0)
    exported = load_adapter(out_dir / "adapter_model.safetensors", shapes=TINY_SHAPES)
    for target, module in original.modules.items():
        assert relative_error(delta(exported.modules[target]), delta(module, 0.5)) <= 1e-6

    # Without --model the tiny shapes are found from the file itself.
    code, out, err = run_cli(capsys, "export", "--adapter", str(source), "--out", str(tmp_path / "auto"), "--json")
    assert code == 0, err
    assert json.loads(out)["num_targets"] == 7


def test_export_cli_partition_names_the_component(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors import safe_open

    source = save(tmp_path / "src.safetensors", native_block("", 0, rank=4))
    for partition in ("transformer", "transformer_ref"):
        out_dir = tmp_path / partition
        code, out, err = run_cli(capsys, "export", "--adapter", str(source), "--model", "tiny", "--partition",
                                 partition, "--out", str(out_dir), "--json")
        assert code == 0, err
        assert json.loads(out)["partition"] == partition
        with safe_open(str(out_dir / "adapter_model.safetensors"), framework="pt") as handle:
            prefixes = {key.split(".", 1)[0] for key in handle.keys()}
            packed = json.loads(handle.metadata()["lora_adapter_metadata"])
        assert prefixes == {partition} and {key.split(".", 1)[0] for key in packed} == {partition}


def test_export_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = save(tmp_path / "src.safetensors", native_block("", 0, rank=4))
    code, _, err = run_cli(capsys, "export", "--adapter", str(source), "--alpha", "-1", "--out", str(tmp_path / "o"))
    assert code == 2 and "alpha must be a finite number > 0" in err and err.count("\n") == 1
    code, _, err = run_cli(capsys, "export", "--adapter", str(source), "--scale", "0", "--out", str(tmp_path / "o"))
    assert code == 2 and "scale 0" in err


def test_module_entry_point_end_to_end(tmp_path: Path) -> None:
    path = save(tmp_path / "a.safetensors", native_block("", 0, rank=4))
    done = run_cli_process("inspect", str(path), "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["format"] == "native"
    bad = run_cli_process("inspect", str(tmp_path / "missing.safetensors"), timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1


def test_inspection_stays_light_it_never_imports_torch(tmp_path: Path) -> None:
    """What ``inspect`` runs in the adapters package (reference parsing, header, plan, alpha) needs no torch."""
    path = save(tmp_path / "a.safetensors", native_block("", 0, rank=4), {"alpha": "2"})
    code = (
        "import json, sys\n"
        "from h3app.adapters.inspect import inspect_header\n"
        "from h3app.adapters.source import read_header\n"
        f"info = inspect_header(read_header({str(path)!r}))\n"
        "print(json.dumps({'targets': info.num_targets, 'torch': 'torch' in sys.modules}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert json.loads(result.stdout) == {"targets": 7, "torch": False}, result.stderr[-2000:]
