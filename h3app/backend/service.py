"""The backend the UI and the API talk to: owns the loaded model and turns requests into mp4 files."""

from __future__ import annotations

import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any, Callable

from ..model.loader import LoadedModel, LoadOptions, load_model
from .generation import GenerationRequest, run_generation, save_result


class Backend:
    """One owner of the pipeline; jobs run one at a time under a lock (the GPU is shared by everyone)."""

    def __init__(self, model: str = "tiny", options: LoadOptions | None = None, output_dir: str | Path | None = None):
        self.model: LoadedModel = load_model(model, "t2va", options)
        self.output_dir = Path(output_dir or Path(tempfile.gettempdir()) / "h3app-outputs")
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    @property
    def model_name(self) -> str:
        return self.model.name

    def generate(self, prompt: str, seed: int = 0, steps: int = 5, duration: float = 5.0,
                 on_step: Callable[[int, int], None] | None = None, **request_fields: Any) -> dict[str, Any]:
        request = GenerationRequest(prompt=prompt, seed=seed, steps=steps, duration=duration, **request_fields)
        with self._lock:
            result = run_generation(self.model.pipeline(request.workflow), request, on_step=on_step)
        settings = {"model": self.model.name, "model_commit": self.model.location.commit,
                    "request": request.to_json(), "adapters": [], "hash": result.hash}
        out = save_result(result, self.output_dir / f"{uuid.uuid4().hex}.mp4", settings)
        return {"out": str(out), **settings, "evaluations": result.evaluations, "frames": result.frames,
                "width": result.width, "height": result.height, "sample_rate": result.sample_rate,
                "seconds": round(result.seconds, 3)}
