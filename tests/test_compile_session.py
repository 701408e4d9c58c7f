"""``--compile`` over what a person does in one session (aot_eager on the CPU): a grid with its no-LoRA baseline, the
equivalence check, generates that change alpha, scale and group strengths, one with the step cache, a swap to
another adapter of the same ranks and the no-LoRA baseline again — zero recompiles by dynamo's own counters, and the baseline kept in place at
strength 0 is bit for bit the detached model's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from h3app.model.compiled import compile_report, is_compiled
from h3app.model.loader import LoadOptions
from h3app.request import GenerationRequest
from h3app.settings import LoRASettings

ROOT = Path(__file__).resolve().parents[1]
STYLE = str(ROOT / "assets" / "adapters" / "tiny_style_warm.safetensors")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def compiled_backend(tmp_path_factory: pytest.TempPathFactory):
    from h3app.backend.service import Backend

    torch.compiler.reset()
    service = Backend("tiny", LoadOptions(compile=True), output_dir=tmp_path_factory.mktemp("compiled-outputs"))
    assert is_compiled(service.model.transformer())
    yield service
    service.close()
    torch.compiler.reset()


def _same_ranks_other_adapter(folder: Path) -> str:
    """``tiny_style_warm`` with other values: same keys, same ranks."""
    generator = torch.Generator().manual_seed(3)
    state = {key: value + 0.05 * torch.randn(value.shape, generator=generator) if value.ndim else value
             for key, value in load_file(STYLE).items()}
    path = folder / "other_style.safetensors"
    save_file(state, str(path))
    return str(path)


def test_a_session_of_grid_check_settings_swap_and_baseline_never_recompiles(compiled_backend, tmp_path):
    backend = compiled_backend
    backend.binder.reset()
    torch.compiler.reset()  # as in a fresh process: no graph yet (the other test may have built some)
    start = compile_report()
    request = GenerationRequest(prompt="a red fox in the snow", steps=3)
    style = LoRASettings(source=STYLE)

    cells = list(backend.grid(request, style, backend.plan_grid([4, 8], [0.5, 1.0], [7])))
    after_grid = compile_report()
    assert after_grid["graphs"] > start["graphs"] and after_grid["recompiles"] == 0
    by_setting = {(cell.alpha, cell.strength): cell.hash for cell in cells}
    assert by_setting[(4, 1.0)] == by_setting[(8, 0.5)]  # the same alpha × strength: bit-identical, compiled
    assert len(set(by_setting.values())) == 3 and all(cell.hash != cell.baseline_hash for cell in cells)

    check = backend.check_equivalence(request, style)
    assert check.identical and check.control_identical

    hashes = {}
    for label, adapters in (
            ("baseline", []),
            ("a", [LoRASettings(source=STYLE, alpha=8, strength=1.0)]),
            ("b", [LoRASettings(source=STYLE, alpha=16, strength=0.5)]),
            ("groups", [LoRASettings(source=STYLE, alpha=8, strength=1.0, group_strengths={"attention": 0.25})]),
            ("swap", [LoRASettings(source=_same_ranks_other_adapter(tmp_path), alpha=2, strength=0.7)]),
            ("baseline again", [])):
        hashes[label] = backend.generate(request, adapters).to_json()["hash"]
    cached = backend.generate(dataclasses.replace(request, steps=8, cache="fbc"),
                              [LoRASettings(source=STYLE, alpha=8, strength=1.0)]).to_json()["cache"]
    assert cached["kind"] == "fbc" and cached["evaluations"] == 7  # the step cache's hooks stay outside the graphs
    assert compile_report() == after_grid  # no new graph, no recompile, from the grid's first run to here
    assert hashes["a"] == hashes["b"]  # alpha × strength is what counts, compiled too
    assert hashes["baseline"] == hashes["baseline again"] == cells[0].baseline_hash
    assert len({hashes["a"], hashes["groups"], hashes["swap"], hashes["baseline"]}) == 4

    # The baseline kept at strength 0 in place is the detached model's output, bit for bit.
    backend.binder.reset()
    assert all(type(m).__name__ != "LoRALinear" for m in backend.model.transformer().modules())
    assert backend.generate(request, []).to_json()["hash"] == hashes["baseline"]


def test_a_compiled_run_with_one_timestep_keeps_the_embedding_in_one_graph(compiled_backend):
    """The first step of a t2va run has one distinct timestep, the next two: one graph serves both."""
    transformer = compiled_backend.model.transformer()
    from h3app.backend.transformer_check import packed_check_input

    inputs = packed_check_input(transformer.config, seed=1)
    one = {**inputs, "timestep": inputs["timestep"][:1],
           "timestep_indices": torch.zeros_like(inputs["timestep_indices"])}
    with torch.no_grad():
        transformer(**inputs, return_dict=False)
        before = compile_report()
        out_one = transformer(**one, return_dict=False)
        transformer(**inputs, return_dict=False)
    assert compile_report() == before
    # the padded row is never read: the output is that of the same timestep given twice
    twice = {**one, "timestep": one["timestep"].repeat(2)}
    with torch.no_grad():
        out_twice = transformer(**twice, return_dict=False)
    assert all(torch.equal(a, b) for a, b in zip(out_one, out_twice))
