"""PDD's head bank: the combination each evaluation runs (the vendor's rule, written out here by hand), the heads a
real run on the tiny checkpoint puts into ``proj_out`` / ``audio_proj_out`` at every evaluation, the refusal of a
schedule off the bank's grid, and the original heads back bit for bit after a run, a cancel, a failure and a
detach."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from adapter_fixtures import save
from extra_parts_fixtures import BANK_SIZE, pdd_tensors

from h3app.adapters.head_bank import AUDIO_SHIFT, VIDEO_SHIFT, check_schedule, head_weights, legal_steps
from h3app.backend.generation import Cancelled, run_generation
from h3app.errors import H3AppError
from h3app.lora.evaluations import EvaluationListener, RunSchedule
from h3app.request import GenerationRequest
from h3app.settings import LoRASettings

HEADS = ("proj_out", "audio_proj_out")


def vendor_weights(evaluation: int, evaluations: int, shift: float, size: int = BANK_SIZE) -> list[float]:
    """The vendor's rule: grid t_k = 1 − s·σ/(1 + (s − 1)·σ), σ = 1 − k/n; evaluation j takes the block of n/N grid
    intervals j·n/N …, each weighted Δt_k / ΣΔt."""
    times = [1 - shift * (1 - k / size) / (1 + (shift - 1) * (1 - k / size)) for k in range(size + 1)]
    block = size // evaluations
    ks = range(evaluation * block, (evaluation + 1) * block)
    total = sum(times[k + 1] - times[k] for k in ks)
    return [(times[k + 1] - times[k]) / total if k in ks else 0.0 for k in range(size)]


@pytest.mark.parametrize("steps", [9, 5, 3])
def test_each_evaluation_runs_the_vendors_combination(steps: int) -> None:
    schedule = RunSchedule.of(steps, VIDEO_SHIFT, AUDIO_SHIFT)
    assert schedule.count == steps - 1
    for index in range(schedule.count):
        evaluation = schedule.evaluation(index)
        video = head_weights(BANK_SIZE, VIDEO_SHIFT, evaluation.sigma, evaluation.sigma_next)
        audio = head_weights(BANK_SIZE, AUDIO_SHIFT, evaluation.audio_sigma, evaluation.audio_sigma_next)
        assert video == pytest.approx(vendor_weights(index, schedule.count, VIDEO_SHIFT), abs=1e-5)
        assert audio == pytest.approx(vendor_weights(index, schedule.count, AUDIO_SHIFT), abs=1e-5)
        assert sum(video) == pytest.approx(1.0) and video != audio  # each modality on its own shift


def test_the_recipe_and_the_grid() -> None:
    assert legal_steps(BANK_SIZE) == [2, 3, 5, 9, 17, 33]
    for steps in (3, 5, 9):
        schedule = RunSchedule.of(steps, VIDEO_SHIFT, AUDIO_SHIFT)
        check_schedule(BANK_SIZE, HEADS, schedule.video_sigmas, schedule.audio_sigmas)
    for steps, shift in ((7, VIDEO_SHIFT), (4, VIDEO_SHIFT), (9, 6.0)):
        schedule = RunSchedule.of(steps, shift, AUDIO_SHIFT)
        with pytest.raises(H3AppError, match=r"distilled for 9 steps \(8 evaluations\) at shift 12 / audio shift 3"):
            check_schedule(BANK_SIZE, HEADS, schedule.video_sigmas, schedule.audio_sigmas)


class _Heads:
    """The heads ``proj_out`` / ``audio_proj_out`` hold while the transformer runs, per evaluation, and the sigmas
    the pipeline's schedulers give that evaluation."""

    def __init__(self, pipe, transformer) -> None:
        self.seen: list[dict[str, torch.Tensor]] = []
        self.sigmas: list[tuple[float, float, float, float]] = []
        self.handles = [transformer.proj_out.register_forward_pre_hook(self.capture)]
        self.pipe, self.transformer = pipe, transformer

    def capture(self, module, args) -> None:
        index = len(self.seen)
        video, audio = self.pipe.scheduler.sigmas, self.pipe.audio_scheduler.sigmas
        self.sigmas.append((float(video[index]), float(video[index + 1]), float(audio[index]), float(audio[index + 1])))
        self.seen.append({f"{name}.{attr}": getattr(self.transformer, name).get_parameter(attr).detach().clone()
                          for name in HEADS for attr in ("weight", "bias")})

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def _expected(tensors: dict, name: str, weights: list[float]) -> torch.Tensor:
    bank = tensors[name].double()
    return torch.einsum("k,k...->...", torch.tensor(weights, dtype=torch.float64), bank).float()


def test_a_run_uses_each_evaluations_heads_and_gives_the_originals_back(
        backend, tiny_model, tmp_path: Path) -> None:
    tensors = pdd_tensors()
    path = save(tmp_path / "MiniMax-H3-FL2VA-Acc-8Step.safetensors", tensors)
    transformer = tiny_model.transformer("t2va")
    pipe = tiny_model.pipeline("t2va")
    original = {f"{n}.{a}": getattr(transformer, n).get_parameter(a).detach().clone() for n in HEADS
                for a in ("weight", "bias")}
    request = GenerationRequest(prompt="a paper boat", seed=4, steps=3)
    heads = _Heads(pipe, transformer)
    try:
        output = backend.generate(request, [LoRASettings(source=str(path))])
    finally:
        heads.close()
    assert output.result.evaluations == 2 and len(heads.seen) == 2
    for index, (sigma, sigma_next, audio_sigma, audio_next) in enumerate(heads.sigmas):
        for name, shift, (a, b) in (("proj_out", VIDEO_SHIFT, (sigma, sigma_next)),
                                    ("audio_proj_out", AUDIO_SHIFT, (audio_sigma, audio_next))):
            weights = vendor_weights(index, 2, shift)
            assert head_weights(BANK_SIZE, shift, a, b) == pytest.approx(weights, abs=1e-5)
            for attr in ("weight", "bias"):
                got = heads.seen[index][f"{name}.{attr}"]
                assert torch.allclose(got, _expected(tensors, f"{name}.{attr}", weights), rtol=1e-5, atol=1e-6)
    for key, value in original.items():  # after the run: the original heads, bit for bit
        assert torch.equal(transformer.get_parameter(key), value)

    # A cancel and a failure half-way leave the original heads too; a schedule off the grid is refused first.
    def head_bits() -> dict[str, bytes]:
        return {key: transformer.get_parameter(key).detach().numpy().tobytes() for key in original}

    calls = []
    with pytest.raises(Cancelled):
        run_generation(pipe, request, should_cancel=lambda: calls.append(1) or len(calls) > 1)
    assert head_bits() == {k: v.numpy().tobytes() for k, v in original.items()}

    class Broken(EvaluationListener):
        def before_evaluation(self, evaluation) -> None:
            if evaluation.index == 1:
                raise RuntimeError("injected")

    with pytest.raises(RuntimeError, match="injected"):
        run_generation(pipe, request, listeners=(Broken(),))
    assert head_bits() == {k: v.numpy().tobytes() for k, v in original.items()}
    with pytest.raises(H3AppError, match="steps 9"):
        backend.generate(GenerationRequest(prompt="a paper boat", seed=4, steps=4), [LoRASettings(source=str(path))])
    backend.binder.reset()  # detach: the guard (tests/model_state.py) then checks every weight bit for bit
