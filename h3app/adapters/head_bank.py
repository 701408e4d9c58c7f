"""The head bank of alibaba-pai's PDD Acc adapters: which combination of heads each evaluation runs (torch-free).

The bank holds ``n`` (32) output heads per head module. The vendor's adapter distils a schedule of ``n`` intervals
on a time grid ``t_k = 1 − s·σ_k / (1 + (s − 1)·σ_k)``, ``σ_k = 1 − k/n`` (k = 0 … n), with the video heads on the
video shift (12) and the audio heads on the audio shift (3); its sampler runs ``n / 4`` = 8 evaluations, evaluation
``j`` covering grid intervals ``4j … 4j + 3`` with the head ``Σ_k w_k · W_k`` (and the same for the bias), ``w_k =
Δt_k / ΣΔt`` over those four intervals.

h3app states the rule for any interval ``[t_a, t_b]`` an evaluation integrates (t = 1 − σ of the run's own schedule,
per modality): ``w_k`` = the length of ``[t_k, t_{k+1}] ∩ [t_a, t_b]`` divided by ``t_b − t_a``. On the vendor's
recipe (9 steps in diffusers' count, shifts 12 / 3) every interval is four whole grid intervals and this *is* the
vendor's rule. A run whose intervals do not start and end on grid points (another step count, another shift) is
refused: the vendor reports heavy noise off its grid.

ComfyUI's ``FinalLayer`` reads a bank's rows as "row block 0 is a full head, later blocks are offsets from it"; the
vendor's adapter takes a plain weighted mean of full heads. h3app follows the vendor, whose file this is
(docs/adapters.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import H3AppError

VIDEO_SHIFT, AUDIO_SHIFT = 12.0, 3.0  # the vendor's pdd_config: the shifts each modality's heads were distilled on
RECIPE_STEPS = 9  # 8 evaluations: num_inference_steps counts the terminal sigma
GRID_TOLERANCE = 1e-5  # diffusers builds sigmas in fp32: a grid point matches within this (in t)
AUDIO_HEADS = "audio_proj_out"


def bank_shift(module: str) -> float:
    """The shift a head module's bank was distilled on."""
    return AUDIO_SHIFT if module == AUDIO_HEADS else VIDEO_SHIFT


def grid_times(size: int, shift: float) -> list[float]:
    """``t_0 … t_size`` of the bank's grid (0 = noise, 1 = clean), float64."""
    times = []
    for k in range(size + 1):
        sigma = 1.0 - k / size
        times.append(1.0 - shift * sigma / (1.0 + (shift - 1.0) * sigma))
    return times


def head_weights(size: int, shift: float, sigma: float, sigma_next: float) -> list[float]:
    """The weight of each of the ``size`` heads for the evaluation from ``sigma`` to ``sigma_next`` (sums to 1)."""
    start, end = 1.0 - sigma, 1.0 - sigma_next
    if not end > start:
        raise H3AppError(f"the head bank needs a decreasing schedule, got sigma {sigma} → {sigma_next}.")
    times = grid_times(size, shift)
    return [max(0.0, min(end, times[k + 1]) - max(start, times[k])) / (end - start) for k in range(size)]


def on_grid(size: int, shift: float, sigmas: Sequence[float]) -> bool:
    """Whether every sigma of a schedule falls on a point of the bank's grid."""
    times = grid_times(size, shift)
    return all(any(abs((1.0 - s) - t) <= GRID_TOLERANCE for t in times) for s in sigmas)


def legal_steps(size: int) -> list[int]:
    """Step counts whose default schedule (at the bank's own shifts) stays on the grid: 1 + every divisor of
    ``size``."""
    return [1 + n for n in range(1, size + 1) if size % n == 0]


def check_schedule(size: int, modules: Sequence[str], video_sigmas: Sequence[float],
                   audio_sigmas: Sequence[float]) -> None:
    """Refuse a run whose evaluations do not start and end on the bank's grid (one line: what runs, what to use)."""
    for module in modules:
        sigmas = audio_sigmas if module == AUDIO_HEADS else video_sigmas
        shift = bank_shift(module)
        if not on_grid(size, shift, sigmas):
            steps = len(video_sigmas)
            good = ", ".join(str(n) for n in legal_steps(size) if n != RECIPE_STEPS and n <= 17)
            raise H3AppError(
                f"the {module} head bank ({size} heads) was distilled for {RECIPE_STEPS} steps ({RECIPE_STEPS - 1} "
                f"evaluations) at shift {VIDEO_SHIFT:g} / audio shift {AUDIO_SHIFT:g}; {steps} steps at this shift "
                f"leave its grid (the vendor reports heavy noise there): use steps {RECIPE_STEPS} (or {good}) with "
                f"shift {VIDEO_SHIFT:g} and audio shift {AUDIO_SHIFT:g}.")
