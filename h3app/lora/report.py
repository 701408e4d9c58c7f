"""What binding an adapter to a transformer found: matched targets, keys that matched nothing, model targets not
covered, shape errors, and the strength profile. ``LoRAEngine.attach`` returns it; ``LoRAEngine.match`` computes
it without binding anything."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..errors import H3AppError
from ..rules.alpha_source import AlphaSource
from .delegate import read_through
from .profile import StrengthProfile


@dataclass(frozen=True)
class TargetMatch:
    """One canonical target bound to the model.

    ``module`` is the module it binds to: the target itself, or ``….attn.to_qkv`` in fused-QKV mode.
    ``alpha``/``alpha_source`` are the values in use (``explicit`` when the settings give an alpha);
    ``effective_scale`` = alpha × strength × group strength / rank (/ √rank for rsLoRA), float64 (JSON key
    ``scale``).
    """

    target: str
    module: str
    group: str
    rank: int
    alpha: float
    alpha_source: AlphaSource
    use_rslora: bool
    effective_scale: float

    def to_json(self) -> dict[str, Any]:
        return {**_as_is(self, "target", "module", "group", "rank", "alpha"), "alpha_source": str(self.alpha_source),
                "use_rslora": self.use_rslora, "scale": self.effective_scale}


@dataclass(frozen=True)
class ShapeError:
    """A target whose factors do not fit the model's Linear (``expected`` = weight ``(out, in)``)."""

    target: str
    expected: tuple[int, int]
    down: tuple[int, ...]
    up: tuple[int, ...]
    problem: str

    def describe(self) -> str:
        return (
            f"{self.target}: {self.problem} (model weight [out={self.expected[0]}, in={self.expected[1]}], "
            f"A {list(self.down)}, B {list(self.up)})"
        )


@dataclass(frozen=True)
class Coverage:
    """How an adapter's targets meet a model's, whatever the settings.

    ``unmatched_keys``: adapter keys that matched nothing — the normaliser's ``unmatched_keys`` plus the source keys
    of targets this model does not have (``absent_targets``). ``uncovered_targets``: LoRA-able targets of the model
    the adapter leaves alone. ``shape_errors``: targets whose factors do not fit (an attached adapter has none).
    """

    unmatched_keys: tuple[str, ...]
    absent_targets: tuple[str, ...]
    uncovered_targets: tuple[str, ...]
    shape_errors: tuple[ShapeError, ...] = ()

    def unmatched_warning(self) -> str | None:
        """The warning that adapter keys matched nothing (a sample of three), or None."""
        if not self.unmatched_keys:
            return None
        sample = ", ".join(list(self.unmatched_keys)[:3])
        return f"{len(self.unmatched_keys)} adapter keys matched nothing in this model (e.g. {sample})."

    def to_json(self) -> dict[str, Any]:
        return {"unmatched_keys": list(self.unmatched_keys), "absent_targets": list(self.absent_targets),
                "uncovered_targets": list(self.uncovered_targets),
                "shape_errors": [e.describe() for e in self.shape_errors]}


@dataclass(frozen=True)
class MatchReport:
    """The result of matching one adapter against one transformer: the matched targets at the current settings and
    the ``coverage`` (its fields read as the report's own). ``profile`` is measured on first access (by
    ``measure``), None on the meta device (no weights to measure) or for a report of nothing bound.
    """

    name: str
    identity: str
    mode: str
    fused_qkv: bool
    matched: tuple[TargetMatch, ...]
    coverage: Coverage
    warnings: tuple[str, ...] = field(default_factory=tuple)
    measure: Callable[[], StrengthProfile | None] | None = field(default=None, repr=False, compare=False)
    exact_parameters: tuple[str, ...] = ()  # parameters its exact deltas and replacements change
    head_banks: tuple[str, ...] = ()  # head modules its head banks drive, per evaluation

    unmatched_keys = read_through("coverage", "unmatched_keys")
    absent_targets = read_through("coverage", "absent_targets")
    uncovered_targets = read_through("coverage", "uncovered_targets")
    shape_errors = read_through("coverage", "shape_errors")

    @cached_property
    def profile(self) -> StrengthProfile | None:
        return self.measure() if self.measure is not None else None

    @property
    def ok(self) -> bool:
        return bool(self.matched or self.exact_parameters or self.head_banks) and not self.shape_errors

    def summary(self) -> str:
        """One line for logs and the CLI."""
        text = (
            f"{self.name}: {len(self.matched)} targets matched, {len(self.unmatched_keys)} keys unmatched, "
            f"{len(self.uncovered_targets)} model targets not covered, {len(self.shape_errors)} shape errors"
        )
        if self.exact_parameters or self.head_banks:
            text += f", {len(self.exact_parameters)} parameters changed exactly, {len(self.head_banks)} head banks"
        if self.profile is not None:
            text += f", median relative update {self.profile.overall.median:.2g}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            **_as_is(self, "name", "identity", "mode", "fused_qkv"),
            "num_matched": len(self.matched),
            "matched": [m.to_json() for m in self.matched],
            **self.coverage.to_json(),
            "profile": self.profile.to_json() if self.profile is not None else None,
            "warnings": list(self.warnings),
            "exact_parameters": list(self.exact_parameters),
            "head_banks": list(self.head_banks),
        }


def _as_is(value: Any, *names: str) -> dict[str, Any]:
    """The attributes ``names`` of ``value`` as JSON entries, in that order (each already a JSON value)."""
    return {name: getattr(value, name) for name in names}


class MatchError(H3AppError):
    """Attaching failed validation (shape errors or nothing matched); nothing was applied. Carries the report."""

    def __init__(self, message: str, report: MatchReport) -> None:
        super().__init__(message)
        self.report = report
