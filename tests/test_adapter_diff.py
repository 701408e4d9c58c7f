"""``python -m h3app diff A B`` (issue 52): per block and group norms and cosine of two adapters' effective deltas,
from the factors alone — A against itself 1, against its negation −1, two independent random adapters near 0, the
per-block rows present, and every number equal to the dense ΔW computed the long way."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
STYLE = ROOT / "assets" / "adapters" / "tiny_style_warm.safetensors"
TURBO = ROOT / "assets" / "adapters" / "tiny_turbo_4step.safetensors"


def _variant(folder: Path, name: str, *, negate: bool = False, seed: int | None = None) -> Path:
    """``tiny_style_warm`` with its up factors negated (ΔW → −ΔW), or with random factors of its shapes."""
    generator = torch.Generator().manual_seed(seed or 0)
    state = {}
    for key, value in load_file(str(STYLE)).items():
        if seed is not None and value.ndim == 2:
            value = torch.randn(value.shape, generator=generator)
        elif negate and "lora_B" in key:
            value = -value
        state[key] = value
    path = folder / f"{name}.safetensors"
    save_file(state, str(path))
    return path


def _diff(capsys, *args: str) -> dict:
    result = run_cli(capsys, "diff", *args, "--model", "tiny", "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_same_negated_and_independent_adapters(capsys, tmp_path):
    same = _diff(capsys, str(STYLE), str(STYLE))
    assert same["cosine"] == pytest.approx(1.0, abs=1e-12)
    assert same["blocks"] and all(row["cosine"] == pytest.approx(1.0, abs=1e-9) for row in same["blocks"])
    assert {"block", "group", "norm_a", "norm_b", "cosine"} <= set(same["blocks"][0])
    assert {row["group"] for row in same["blocks"]} >= {"attention", "refiner"}
    negated = _diff(capsys, str(STYLE), str(_variant(tmp_path, "negated", negate=True)))
    assert negated["cosine"] == pytest.approx(-1.0, abs=1e-12)
    independent = _diff(capsys, str(_variant(tmp_path, "r1", seed=1)), str(_variant(tmp_path, "r2", seed=2)))
    assert abs(independent["cosine"]) < 0.3
    # the strength scales the norm and leaves the direction: B at scale 0.5 has half A's norm, cosine 1
    half = _diff(capsys, str(STYLE), f"{STYLE},scale=0.5")
    assert half["norm_b"] == pytest.approx(half["norm_a"] / 2, rel=1e-12) and half["cosine"] == pytest.approx(1.0)
    text = run_cli(capsys, "diff", str(STYLE), str(STYLE), "--model", "tiny")
    assert text.code == 0 and text.out.startswith("cosine       +1.000")


def test_factor_products_equal_the_dense_deltas(tmp_path):
    from h3app.adapters.normalise import load_adapter
    from h3app.lora.similarity import compare_adapters, delta_terms
    from h3app.model.repo import TINY, read_transformer_config
    from h3app.rules.blocks import block_index
    from h3app.rules.h3_modules import transformer_shapes
    from h3app.settings import LoRASettings

    shapes = transformer_shapes(read_transformer_config(TINY))
    a, b = (load_adapter(p, shapes=shapes) for p in (STYLE, TURBO))
    sa, sb = LoRASettings(source=str(STYLE), alpha=3.0, strength=0.7), LoRASettings(source=str(TURBO), strength=-1.5)
    result = compare_adapters(a, sa, b, sb).to_json()

    def dense(terms):
        return {path: sum(s * (m @ d if d is not None else m) for s, m, d in items) for path, items in terms.items()}

    da, db = dense(delta_terms(a, sa)), dense(delta_terms(b, sb))
    paths = set(da) | set(db)
    aa = sum(float((da[p] ** 2).sum()) for p in da)
    bb = sum(float((db[p] ** 2).sum()) for p in db)
    ab = sum(float((da[p] * db[p]).sum()) for p in paths if p in da and p in db)
    assert result["norm_a"] == pytest.approx(math.sqrt(aa), rel=1e-9)
    assert result["norm_b"] == pytest.approx(math.sqrt(bb), rel=1e-9)
    assert result["cosine"] == pytest.approx(ab / math.sqrt(aa * bb), abs=1e-9)
    some = next(row for row in result["blocks"] if row["block"] == 0 and row["group"] == "attention")
    in_cell = [p for p in paths if block_index(p.rsplit(".", 1)[0]) == 0 and ".attn." in p]
    cell_aa = sum(float((da[p] ** 2).sum()) for p in in_cell if p in da)
    assert some["norm_a"] == pytest.approx(math.sqrt(cell_aa), rel=1e-9)
    # the scale is the engine's: alpha 3 × 0.7 / rank for every module of A
    assert sa.alpha is not None and all(abs(s - 3.0 * 0.7 / m.shape[1]) < 1e-12
                                        for items in delta_terms(a, sa).values() for s, m, _ in items)


def test_bad_spec_is_one_line_before_torch(capsys):
    result = run_cli(capsys, "diff", str(STYLE), f"{STYLE},colour=red")
    assert result.code == 2 and "unknown field" in result.err and len(result.err.strip().splitlines()) == 1
