"""``export`` of a tuned stack (issue 52): ``--adapter A --scale 1 --adapter-spec "B,scale=0.5"`` writes one PEFT
file whose run at strength 1 is the stack's run (≥ 40 dB; the pairs concatenate exactly), ``--rank`` at the full
rank keeps every bit of energy, a smaller rank says what it dropped, and the SVD resize is the best of its rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[1]
STYLE = ROOT / "assets" / "adapters" / "tiny_style_warm.safetensors"
TURBO = ROOT / "assets" / "adapters" / "tiny_turbo_4step.safetensors"
STACK = ("--adapter", str(STYLE), "--scale", "1", "--adapter-spec", f"{TURBO},scale=0.5")


def _export(capsys, out: Path, *extra: str) -> dict:
    result = run_cli(capsys, "export", *STACK, "--model", "tiny", "--out", str(out), *extra, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_the_stack_factors_sum_to_each_adapters_scaled_delta(capsys, tmp_path):
    from safetensors.torch import load_file

    from h3app.adapters.normalise import load_adapter
    from h3app.model.repo import TINY, read_transformer_config
    from h3app.rules.h3_modules import transformer_shapes
    from h3app.rules.scale import effective_scale

    written = _export(capsys, tmp_path / "stack")
    assert written["resize"] is None and [p["strength"] for p in written["stack"]] == [1.0, 0.5]
    tensors = load_file(written["weights"])
    shapes = transformer_shapes(read_transformer_config(TINY))
    a, b = load_adapter(STYLE, shapes=shapes), load_adapter(TURBO, shapes=shapes)
    target = next(t for t in a.modules if t in b.modules)
    expected = sum(effective_scale(m.alpha, s, m.rank, m.use_rslora) * (m.up.double() @ m.down.double())
                   for m, s in ((a.modules[target], 1.0), (b.modules[target], 0.5)))
    down = tensors[f"transformer.{target}.lora_A.weight"].double()
    up = tensors[f"transformer.{target}.lora_B.weight"].double()
    config = json.loads(Path(written["config"]).read_text())
    r = config["rank_pattern"].get(f"^{target}", config["r"])
    alpha = config["alpha_pattern"].get(f"^{target}", config["lora_alpha"])
    assert r == a.modules[target].width + b.modules[target].width and alpha == r  # scale 1 at strength 1
    assert torch.allclose(up @ down, expected, rtol=1e-5, atol=1e-6)


def test_resize_by_svd_reports_what_it_kept(capsys, tmp_path):
    full = _export(capsys, tmp_path / "full", "--rank", "64")
    assert full["resize"]["energy_kept"] == pytest.approx(1.0, abs=1e-12)
    assert full["resize"]["max_relative_error"] < 1e-6 and full["resize"]["cut_targets"] == 0
    small = _export(capsys, tmp_path / "small", "--rank", "2")
    assert 0 < small["resize"]["energy_kept"] < 1 and small["resize"]["max_relative_error"] > 1e-3
    assert small["r"] <= 2 and small["resize"]["worst_target"]
    text = run_cli(capsys, "export", *STACK, "--model", "tiny", "--out", str(tmp_path / "t"), "--rank", "2")
    assert text.code == 0 and "of the energy kept, largest relative error" in text.out


def test_svd_resize_is_the_best_approximation_of_its_rank():
    from h3app.adapters.stack import resize
    from h3app.adapters.types import ModuleLoRA
    from h3app.rules.alpha_source import AlphaSource

    generator = torch.Generator().manual_seed(0)
    down, up = torch.randn(12, 40, generator=generator), torch.randn(30, 12, generator=generator)
    delta = (up.double() @ down.double())
    modules = {"t": ModuleLoRA("t", down, up, 12.0, AlphaSource.EXPLICIT)}
    [small], report = resize(modules, 5)[0].values(), resize(modules, 5)[1]
    s = torch.linalg.svdvals(delta)
    best = float(torch.sqrt((s[5:] ** 2).sum()) / torch.sqrt((s**2).sum()))
    got = float(torch.linalg.norm(small.up @ small.down - delta) / torch.linalg.norm(delta))
    assert got == pytest.approx(best, rel=1e-9) and report.max_relative_error == pytest.approx(best, rel=1e-9)
    assert small.width == 5 and small.alpha == 5.0


def test_a_schedule_in_the_stack_is_refused_in_one_line(capsys, tmp_path):
    result = run_cli(capsys, "export", *STACK[:-1], f"{TURBO},scale=0.5,schedule=linear:1:0", "--model", "tiny",
                     "--out", str(tmp_path / "x"))
    assert result.code == 2 and "strength schedule" in result.err and len(result.err.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_one_file_runs_as_the_stack(backend, capsys, tmp_path):
    from h3app.backend.metrics import compare
    from h3app.request import GenerationRequest
    from h3app.settings import LoRASettings

    request = GenerationRequest(prompt="a red ball", steps=3, height=16, width=16, seed=3)
    stack = backend.generate(request, [LoRASettings(source=str(STYLE), strength=1.0),
                                       LoRASettings(source=str(TURBO), strength=0.5)]).result
    for extra, name in (((), "concat"), (("--rank", "64"), "full_rank")):
        written = _export(capsys, tmp_path / name, *extra)
        one = backend.generate(request, [LoRASettings(source=written["out"], strength=1.0)]).result
        diff = compare(stack.video, stack.audio, one.video, one.audio)
        assert diff.video_psnr >= 40, (name, diff.video_psnr)
    base = backend.generate(request, []).result
    assert compare(stack.video, stack.audio, base.video, base.audio).video_psnr < 40  # the stack changed the video


def test_the_pages_diffusers_snippet_exports_the_slots_in_use_as_one_stack(capsys, tmp_path, monkeypatch):
    import shlex

    from h3app.ui.presenters import snippets

    request = {"prompt": "p", "seed": 1, "steps": 3, "duration": 5.0, "height": 16, "width": 16, "workflow": "t2va"}
    adapters = [{"source": str(STYLE), "alpha": None, "strength": 1.0},
                {"source": str(TURBO), "alpha": 2.0, "strength": 0.5, "block_strength": "1:2"}]
    text = snippets.diffusers_snippet({"model": "tiny", "request": request, "adapters": adapters})
    [command] = [line for line in text.splitlines() if "python -m h3app export" in line]
    assert text.count("load_lora_weights") == 1 and "set_adapters(['lora_1'], adapter_weights=[1.0])" in text
    argv = shlex.split(command.split("python -m h3app ", 1)[1])
    assert argv[argv.index("--adapter-spec") + 1] == f"{TURBO},alpha=2,scale=0.5,blocks=1:2"
    monkeypatch.chdir(tmp_path)
    result = run_cli(capsys, *argv, "--model", "tiny", "--json")  # the printed command runs as printed
    assert result.code == 0, result.err
    written = json.loads(result.out)
    assert [(p["strength"], p["block_strength"]) for p in written["stack"]] == [(1.0, ""), (0.5, "1:2")]
