"""A head bank during a run: at each evaluation the output heads are the bank's combination for that evaluation's
interval of the schedule (``h3app.adapters.head_bank``), written into ``proj_out`` / ``audio_proj_out`` in place;
after the run (success, error or cancel) the original heads are back bit for bit.

Between runs the bank's heads hold nothing (``BankHead.current`` is None), so the model runs its original heads; a
single forward outside a generation (``check --mode transformer``) runs them too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ..adapters.head_bank import AUDIO_HEADS, bank_shift, check_schedule, head_weights
from .evaluations import Evaluation, EvaluationListener, RunSchedule
from .exact import BankHead


class BankListener(EvaluationListener):
    """One adapter's head banks (``module → (weight head, bias head or None)``); ``write(heads)`` puts the listed
    heads' ``current`` into their parameters (the engine's in-place writer)."""

    def __init__(self, adapter: str, banks: Mapping[str, tuple[BankHead, BankHead | None]],
                 write: Callable[[list[BankHead]], None]) -> None:
        self.adapter = adapter
        self.banks = dict(banks)
        self._write = write
        self.log: list[tuple[int, str, tuple[float, ...]]] | None = None  # (evaluation, module, weights) when set

    @property
    def heads(self) -> list[BankHead]:
        return [head for pair in self.banks.values() for head in pair if head is not None]

    @property
    def size(self) -> int:
        return next(iter(self.banks.values()))[0].bank.shape[0]

    def run_starting(self, schedule: RunSchedule) -> None:
        check_schedule(self.size, list(self.banks), schedule.video_sigmas, schedule.audio_sigmas)

    def before_evaluation(self, evaluation: Evaluation) -> None:
        for module, pair in self.banks.items():
            sigma, sigma_next = ((evaluation.audio_sigma, evaluation.audio_sigma_next) if module == AUDIO_HEADS
                                 else (evaluation.sigma, evaluation.sigma_next))
            weights = head_weights(self.size, bank_shift(module), sigma, sigma_next)
            if self.log is not None:
                self.log.append((evaluation.index, module, tuple(weights)))
            factors = torch.tensor(weights, dtype=torch.float64).to(torch.float32)
            for head in pair:
                if head is not None:
                    head.select(factors)
        self._write(self.heads)

    def run_finished(self) -> None:
        for head in self.heads:
            head.current = None
        self._write(self.heads)
