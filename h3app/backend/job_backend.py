"""What a job (``jobs``) and a ZeroGPU call (``gpu_calls``) use of the Backend (``service.Backend``), as a structural
type: those modules cannot import ``service`` (it imports them), and the type checker holds the Backend to this
shape wherever one is passed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..model.loader import LoadedModel
    from ..request import GenerationRequest
    from .adapter_binding import AdapterBinder
    from .grid import Baselines
    from .outputs import Outputs


class JobBackend(Protocol):
    """One process's Backend as a job sees it: the held model and its adapter binder, the output folder, the grid's
    kept baselines and cells, the last run's seconds, and the time model's prediction for a request."""

    model: LoadedModel
    binder: AdapterBinder
    baselines: Baselines  # a grid's no-LoRA runs, by request and seed
    cells: Baselines  # a grid's cells computed before: served, not run again
    last_seconds_per_run: float | None

    @property
    def outputs(self) -> Outputs: ...

    def cleanup_outputs(self, keep_seconds: float = ...) -> int: ...

    def predicted_time(self, request: GenerationRequest) -> dict[str, Any] | None:
        """The plan's prediction of ``request`` on this box (``video_s``, its terms), or None."""
        ...

    def predicted_or_none(self, request: GenerationRequest) -> dict[str, Any] | None:
        """:meth:`predicted_time` for a run's record: a prediction that fails is logged and left out."""
        ...
