"""The full-mode equivalence check (the whole pipeline: fallback, A, control, B) with a strength schedule, per-modality
and per-block factors: A (alpha 8 × 1) and B (alpha 128 × 0.0625) stay bit-identical — the factors multiply both
sides — and the factors do change the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from h3app.request import GenerationRequest
from h3app.settings import LoRASettings

TURBO = str(Path(__file__).resolve().parents[1] / "assets" / "adapters" / "lightx2v_turbo_no_alpha.safetensors")


@pytest.mark.slow  # four runs of the whole pipeline
def test_full_check_is_identical_with_every_advanced_factor(backend):
    request = GenerationRequest(prompt="a boat", seed=0, steps=4)  # 3 evaluations
    advanced = LoRASettings(source=TURBO, video_strength=0.7, audio_strength=0.0, text_strength=1.3,
                            strength_schedule="1,0.5,0.25", block_strength="1:2")
    result = backend.check_equivalence(request, advanced)
    assert result.identical and result.control_identical
    assert result.a.hash == result.b.hash != result.fallback.hash
    recorded = result.settings["adapter"]
    assert (recorded["audio_strength"], recorded["strength_schedule"], recorded["block_strength"]) == (
        0.0, "1,0.5,0.25", "1:2")
    plain = backend.check_equivalence(request, LoRASettings(source=TURBO))
    assert plain.identical and plain.a.hash != result.a.hash  # the factors reached the run
