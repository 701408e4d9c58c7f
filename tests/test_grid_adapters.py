"""The grid's rows of adapters (issue 52): ``grid --adapters A B``, a folder's checkpoints by a glob in training
order with their labels, each cell bit for bit ``generate``'s run, cells computed before served from the cell cache,
the row limit named in one line, and no recompile across adapters of ranks 4 and 16 under ``--compile``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli
from safetensors.torch import load_file, save_file

from h3app.adapters.checkpoints import Checkpoint, match_files, name_number, order_checkpoints
from h3app.adapters.training import TrainingInfo
from h3app.errors import H3AppError

ROOT = Path(__file__).resolve().parents[1]
STYLE = ROOT / "assets" / "adapters" / "tiny_style_warm.safetensors"
TURBO = ROOT / "assets" / "adapters" / "tiny_turbo_4step.safetensors"
FAST = ("--steps", "2", "--height", "16", "--width", "16")


def _epoch_copy(folder: Path, name: str, epoch: int | None, seed: int) -> Path:
    """``tiny_style_warm`` with other up factors (``seed``), its header recording ``ss_epoch`` (None: no metadata)
    and a trigger word through ``ss_tag_frequency``."""
    generator = torch.Generator().manual_seed(seed)
    state = {k: v + 0.05 * torch.randn(v.shape, generator=generator) if "lora_B" in k or "lora_up" in k else v
             for k, v in load_file(str(STYLE)).items()}
    metadata = ({"ss_epoch": str(epoch), "ss_tag_frequency": json.dumps({"1_zorb": {"zorb": 9, "cat": 3}})}
                if epoch is not None else None)
    path = folder / f"{name}.safetensors"
    save_file(state, str(path), metadata=metadata)
    return path


def _rank_copy(folder: Path, name: str, rank: int, seed: int, attention_only: bool = False) -> Path:
    """An adapter on ``tiny_style_warm``'s modules (``attention_only``: its attention modules alone) with random
    factors of ``rank`` (no alpha tensors: alpha = rank)."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for key, value in load_file(str(STYLE)).items():
        if value.ndim != 2 or (attention_only and ".attn." not in key):
            continue
        down = "lora_A" in key or "lora_down" in key
        shape = (rank, value.shape[1]) if down else (value.shape[0], rank)
        state[key] = 0.05 * torch.randn(shape, generator=generator)
    path = folder / f"{name}.safetensors"
    save_file(state, str(path))
    return path


def test_checkpoints_sort_by_training_progress_then_the_number_in_the_name():
    infos = {"zorb-e10.safetensors": 10, "zorb-e2.safetensors": 2, "zorb-e1.safetensors": 1}
    ordered = order_checkpoints(list(infos), lambda name: {"ss_epoch": str(infos[name])})
    assert [c.training.epoch for c in ordered] == [1, 2, 10]
    # the metadata wins over the name: a file named 9 at epoch 3 comes before one named 4 at epoch 5
    ordered = order_checkpoints(["run-9.safetensors", "run-4.safetensors"],
                                lambda name: {"ss_epoch": "3" if "9" in name else "5"})
    assert [c.weight_name for c in ordered] == ["run-9.safetensors", "run-4.safetensors"]
    # without metadata: the last number in the name (kohya's -000004), not the text order
    ordered = order_checkpoints(["r-000010.safetensors", "r-000004.safetensors", "r.safetensors"], lambda name: {})
    assert [c.weight_name for c in ordered] == ["r.safetensors", "r-000004.safetensors", "r-000010.safetensors"]
    assert name_number("out/zorb-e10.safetensors") == 10 and name_number("final.safetensors") is None
    label = Checkpoint("out/zorb-e2.safetensors", TrainingInfo(epoch=2, steps=1200, trigger_words=("zorb",))).label
    assert label == "zorb-e2 (epoch 2, 1,200 steps, trigger zorb)"


def test_a_glob_over_the_limit_is_refused_in_one_line_naming_the_limit():
    names = [f"run-{i}.safetensors" for i in range(12)]
    assert match_files(names, "run-1*.safetensors", "out", 8) == ["run-1.safetensors", "run-10.safetensors",
                                                                   "run-11.safetensors"]
    with pytest.raises(H3AppError) as refused:
        match_files(names, "*.safetensors", "out", 8)
    line = str(refused.value)
    assert "\n" not in line and "matches 12 files" in line and "more than the 8 rows" in line
    with pytest.raises(H3AppError, match="matches none"):
        match_files(names, "*.pt", "out", 8)


def test_hosted_server_refuses_a_glob_past_its_row_limit(tiny_model, tmp_path):
    from h3app.backend.service import Backend
    from h3app.hosting.limits import LIMITS
    from h3app.settings import LoRASettings

    folder = tmp_path / "run"
    folder.mkdir()
    for i in range(LIMITS.grid_rows + 1):
        (folder / f"run-{i}.safetensors").write_bytes(STYLE.read_bytes())
    service = Backend(loaded=tiny_model, output_dir=tmp_path / "out", hosted=True, allowed_local_dirs=[tmp_path])
    try:
        with pytest.raises(H3AppError) as refused:
            service.grid_rows([LoRASettings(source=str(folder), weight_name="*.safetensors")])
        assert f"more than the {LIMITS.grid_rows} rows" in str(refused.value)
        with pytest.raises(H3AppError, match=f"more than the {LIMITS.grid_rows} rows"):
            service.plan_grid([None], [1.0], [0], adapters=LIMITS.grid_rows + 1)
    finally:
        service.close()


@pytest.mark.slow
def test_a_folder_glob_gives_rows_in_epoch_order_with_labels(backend, tmp_path):
    from h3app.settings import LoRASettings

    folder = tmp_path / "zorb"
    folder.mkdir()
    for seed, epoch in enumerate((10, 2, 1)):
        _epoch_copy(folder, f"zorb-e{epoch}", epoch, seed)
    rows = backend.grid_rows([LoRASettings(source=str(folder), weight_name="*.safetensors")])
    assert [row.training["epoch"] for row in rows] == [1, 2, 10]
    assert [row.settings.weight_name for row in rows] == ["zorb-e1.safetensors", "zorb-e2.safetensors",
                                                          "zorb-e10.safetensors"]
    assert rows[0].label == "zorb-e1 (epoch 1, trigger zorb)"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grid_over_adapters_matches_generate_bit_for_bit_and_reuses_cells(capsys, tmp_path):
    grid = run_cli(capsys, "grid", "--model", "tiny", "--adapters", str(STYLE), str(TURBO), "--scales", "0.5,1",
                   "--seeds", "3", "--prompt", "a red ball", *FAST, "--out-dir", str(tmp_path / "grid"), "--json")
    assert grid.code == 0, grid.err
    result = json.loads(grid.out)
    assert [row["label"] for row in result["rows"]] == ["tiny_style_warm", "tiny_turbo_4step"]
    cells = {(c["adapter_row"], c["strength"]): c for c in result["cells"]}
    assert len(cells) == 4 and all(c["alpha"] is None and c["seed"] == 3 for c in cells.values())
    assert len({c["hash"] for c in cells.values()}) == 4  # each adapter and strength made its own video
    assert Path(cells[(1, 1.0)]["video_path"]).name == "r1-tiny_turbo_4step-alphaauto-scale1-seed3.mp4"
    generate = run_cli(capsys, "generate", "--model", "tiny", "--adapter", str(TURBO), "--scale", "1", "--seed", "3",
                       "--prompt", "a red ball", *FAST, "--out", str(tmp_path / "b.mp4"), "--json")
    assert generate.code == 0, generate.err
    assert json.loads(generate.out)["hash"] == cells[(1, 1.0)]["hash"]


@pytest.mark.slow
def test_cells_computed_before_are_served_not_run_again(backend):
    from h3app.backend.grid_rows import GridRow
    from h3app.request import GenerationRequest
    from h3app.settings import LoRASettings

    rows = [GridRow(LoRASettings(source=str(STYLE)), "style"), GridRow(LoRASettings(source=str(TURBO)), "turbo")]
    request = GenerationRequest(prompt="grid rows", steps=2, height=16, width=16, seed=5)
    first = list(backend.grid(request, rows, backend.plan_grid([None], [1.0], [5], adapters=2)))
    assert [c.reused for c in first] == [False, False]
    steps: list[int] = []
    again = list(backend.grid(request, rows, backend.plan_grid([None], [1.0, 0.5], [5], adapters=2),
                              on_step=lambda done, total: steps.append(done)))
    assert [(c.adapter_row, c.strength, c.reused) for c in again] == [(0, 1.0, True), (0, 0.5, False),
                                                                      (1, 1.0, True), (1, 0.5, False)]
    assert [c.hash for c in again if c.reused] == [c.hash for c in first]
    assert [c.label for c in again] == ["style", "style", "turbo", "turbo"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compiled_grid_over_ranks_4_and_16_never_recompiles(capsys, tmp_path):
    low, high = _rank_copy(tmp_path, "rank4", 4, 1), _rank_copy(tmp_path, "rank16", 16, 2)
    torch.compiler.reset()
    grid = run_cli(capsys, "grid", "--model", "tiny", "--compile", "--adapters", str(low), str(high),
                   "--scales", "0.5,1", "--seeds", "3", "--prompt", "a red ball", *FAST,
                   "--out-dir", str(tmp_path / "grid"), "--json")
    torch.compiler.reset()
    assert grid.code == 0, grid.err
    result = json.loads(grid.out)
    assert result["compile"]["graphs"] > 0 and result["compile"]["recompiles"] == 0, result["compile"]
    assert [c["adapter"]["rank"] for c in result["cells"]] == [4, 4, 16, 16]
    assert len({c["hash"] for c in result["cells"]}) == 4


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compiled_grid_over_adapters_on_different_modules_never_recompiles(capsys, tmp_path):
    low, high = _rank_copy(tmp_path, "all4", 4, 1), _rank_copy(tmp_path, "attn16", 16, 2, attention_only=True)
    torch.compiler.reset()
    grid = run_cli(capsys, "grid", "--model", "tiny", "--compile", "--adapters", str(high), str(low),
                   "--scales", "1", "--seeds", "3", "--prompt", "a red ball", *FAST,
                   "--out-dir", str(tmp_path / "grid"), "--json")
    torch.compiler.reset()
    assert grid.code == 0, grid.err
    result = json.loads(grid.out)
    assert result["compile"]["recompiles"] == 0, result["compile"]
    targets = [sum(g["targets"] for g in c["adapter"]["resolved"]["groups"]) for c in result["cells"]]
    assert targets[0] < targets[1]  # the attention-only row covers fewer modules
    assert len({c["hash"] for c in result["cells"]}) == 2
