"""The step cache (``--cache fbc``, diffusers' first-block cache) on the tiny checkpoint: it skips evaluations and
says which, every evaluation is still heard, A and B of the check take the same decisions and stay bit-identical,
nothing is left on the model afterwards, and a PDD head bank is refused with it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from adapter_fixtures import save
from extra_parts_fixtures import pdd_tensors

from h3app.backend import metrics
from h3app.backend.generation import run_generation
from h3app.errors import H3AppError
from h3app.lora.evaluations import EvaluationListener
from h3app.model import denoise_cache
from h3app.model.denoise_cache import FBC_THRESHOLD, first_block_cache, step_cache
from h3app.request import GenerationRequest
from h3app.settings import LoRASettings

ROOT = Path(__file__).resolve().parents[1]
STYLE = str(ROOT / "assets" / "adapters" / "tiny_style_warm.safetensors")
PROMPT = "a paper boat drifting down a rain-filled street gutter"


class Heard(EvaluationListener):
    def __init__(self) -> None:
        self.before: list[int] = []
        self.after: list[int] = []

    def before_evaluation(self, evaluation) -> None:
        self.before.append(evaluation.index)

    def after_evaluation(self, evaluation, output) -> None:
        self.after.append(evaluation.index)


def _bare_blocks(transformer: torch.nn.Module) -> bool:
    """No diffusers hook left on the blocks (the cache takes its hooks off after each run)."""
    return all("forward" not in vars(block) for block in transformer.transformer_blocks) and \
        not transformer.is_cache_enabled


def test_a_cached_run_skips_evaluations_hears_every_one_and_leaves_nothing_behind(tiny_model, backend):
    pipe = tiny_model.pipeline("t2va")
    transformer = tiny_model.transformer("t2va")
    backend.binder.apply([LoRASettings(source=STYLE)])
    try:
        request = GenerationRequest(prompt=PROMPT, steps=12)
        plain = run_generation(pipe, request)
        heard, steps = Heard(), []
        cached = run_generation(pipe, dataclasses.replace(request, cache="fbc"), listeners=(heard,),
                                on_step=lambda done, total: steps.append(done))
        again = run_generation(pipe, request)
    finally:
        backend.binder.reset()
    record = cached.cache
    assert plain.cache == {"kind": "none", "threshold": None, "evaluations": 11, "skipped": 0, "skipped_at": []}
    assert record["kind"] == "fbc" and record["threshold"] == FBC_THRESHOLD
    assert record["evaluations"] == cached.evaluations == plain.evaluations == 11
    assert 0 < record["skipped"] == len(record["skipped_at"]) < 11
    assert 0 not in record["skipped_at"]  # the first evaluation has nothing to reuse
    assert heard.before == heard.after == list(range(11))  # a skipped evaluation is still an evaluation
    assert steps == [*range(11), 11]
    assert cached.hash != plain.hash and metrics.psnr(plain.video, cached.video) > 20
    assert again.hash == plain.hash and _bare_blocks(transformer)  # the model is as loaded again


def test_threshold_zero_computes_every_block_and_changes_nothing(tiny_model):
    """A decision to compute returns the blocks' own output: with nothing skipped, the run is the uncached run."""
    pipe = tiny_model.pipeline("t2va")
    transformer = tiny_model.transformer("t2va")
    request = GenerationRequest(prompt=PROMPT, steps=6)
    plain = run_generation(pipe, request)
    with first_block_cache(transformer, threshold=0.0) as count:
        with torch.inference_mode():
            state = pipe(prompt=PROMPT, num_inference_steps=6, num_frames=request.num_frames, output_type="np",
                         generator=torch.Generator("cpu").manual_seed(request.seed))
    assert count.evaluations == 5 and count.skipped == 0
    assert (state.get("videos")[0] == plain.video).all()
    with first_block_cache(transformer, threshold=1e9) as count:  # anything moves less: all but the first skip
        with torch.inference_mode():
            pipe(prompt=PROMPT, num_inference_steps=6, num_frames=request.num_frames, output_type="np",
                 generator=torch.Generator("cpu").manual_seed(request.seed))
    assert count.to_json()["skipped_at"] == [1, 2, 3, 4]
    assert _bare_blocks(transformer)


def test_the_check_with_the_cache_takes_the_same_decisions_on_both_sides(backend):
    request = GenerationRequest(prompt=PROMPT, steps=12, cache="fbc")
    result = backend.check_equivalence(request, LoRASettings(source=STYLE)).to_json()
    assert result["identical"] is True and result["control_identical"] is True
    assert result["cache"]["same_decisions"] is True and result["cache"]["skipped"] > 0
    assert result["a"]["cache"]["skipped_at"] == result["b"]["cache"]["skipped_at"]
    assert result["fallback"]["cache"]["kind"] == "fbc"


def test_a_head_bank_with_the_cache_is_refused_before_anything_runs(backend, tiny_model, tmp_path):
    path = save(tmp_path / "MiniMax-H3-FL2VA-Acc-8Step.safetensors", pdd_tensors())
    calls = []
    with pytest.raises(H3AppError, match="cannot run with a PDD head-bank adapter") as error:
        backend.generate(GenerationRequest(prompt=PROMPT, seed=4, steps=9, cache="fbc"),
                         [LoRASettings(source=str(path))], on_step=lambda *a: calls.append(a))
    assert "\n" not in str(error.value) and calls == []
    backend.binder.reset()
    assert _bare_blocks(tiny_model.transformer("t2va"))


def test_unknown_caches_and_too_few_blocks_are_one_line():
    with pytest.raises(H3AppError, match="--cache must be one of none, fbc"):
        GenerationRequest(prompt=PROMPT, cache="teacache")
    one_block = torch.nn.Module()
    one_block.transformer_blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    with pytest.raises(H3AppError, match="at least two main blocks"), step_cache(one_block, "fbc"):
        pass
    assert denoise_cache.check_cache("none") == "none"
