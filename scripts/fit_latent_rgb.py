"""Refit a model's latent → RGB preview factors from its own decodes, and write them to h3app/model/latent_rgb.json.

    python scripts/fit_latent_rgb.py --model tiny                       # the embedded tiny checkpoint (CPU, ~1 min)
    python scripts/fit_latent_rgb.py --model full --device cuda --dtype bfloat16 --height 544 --width 960

Each run generates one video from its own noise; its last evaluation's clean estimate x̂₀ is the final latent (σ_next
= 0: the scheduler's last step returns x̂₀ itself) and the pipeline's decode of it is the video. The factors are the
least-squares map from every latent pixel to the mean colour of the pixels it decodes to (``h3app.model.latent_rgb``),
fitted on all runs but the last ``--held-out`` and scored (Pearson r of grey levels) on those. Only this model's
VAE entry is replaced; the others stay.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from h3app.backend.generation import run_generation  # noqa: E402
from h3app.backend.preview import clean_estimate, read_layout  # noqa: E402
from h3app.lora.evaluations import Evaluation, EvaluationListener  # noqa: E402
from h3app.model import latent_rgb  # noqa: E402
from h3app.model.loader import LoadOptions, check_device, load_model, parse_dtype  # noqa: E402
from h3app.request import GenerationRequest  # noqa: E402

# Ball scenes (what the tiny checkpoint was trained on) alternate with general scenes (what the real model makes).
PROMPTS = (
    "a red ball moving left over a grey floor", "a paper boat drifting down a rain-filled street gutter",
    "a blue ball moving up over a sand floor", "a city street at night with neon signs reflected in puddles",
    "a green ball moving right over a sand floor", "waves rolling onto a sandy beach at sunset",
    "a yellow ball moving down over a grey floor", "a forest path in autumn with falling orange leaves",
)


class FinalLatents(EvaluationListener):
    """Keeps the clean estimate of the run's last evaluation: its final video latents ``(C, L, h, w)``."""

    def __init__(self, pipe: Any) -> None:
        self.pipe, self.latents = pipe, None

    def evaluated(self, evaluation: Evaluation, inputs: Any, output: Any) -> None:
        if evaluation.index == evaluation.count - 1:
            layout = read_layout(inputs, self.pipe.patch_size, int(self.pipe.audio_channels))
            self.latents = clean_estimate(inputs, output, layout)[0][0].float().cpu()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny, full, a local folder or a Hub repo id")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--runs", type=int, default=len(PROMPTS), help=f"generations (prompts cycle; max useful "
                                                                        f"{len(PROMPTS)} per seed)")
    parser.add_argument("--held-out", type=int, default=2, help="runs kept out of the fit to score it")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--out", default=str(latent_rgb.FACTORS_FILE))
    args = parser.parse_args(argv)
    if not 0 < args.held_out < args.runs:
        parser.error("--held-out must be at least 1 and fewer than --runs")
    model = load_model(args.model, "t2va", LoadOptions(device=check_device(args.device), dtype=parse_dtype(args.dtype)))
    pipe = model.pipeline("t2va")
    collected = []
    for run in range(args.runs):
        request = GenerationRequest(prompt=PROMPTS[run % len(PROMPTS)], seed=run // len(PROMPTS), steps=args.steps,
                                    height=args.height, width=args.width)
        final = FinalLatents(pipe)
        result = run_generation(pipe, request, listeners=(final,))
        collected.append(latent_rgb.pairs(final.latents, result.video))
        print(f"run {run + 1}/{args.runs}: {request.prompt!r}, latents {tuple(final.latents.shape)}", flush=True)
    factors = latent_rgb.fitted(model.name, latent_rgb.vae_fingerprint(dict(pipe.vae.config)),
                                collected[:-args.held_out], collected[-args.held_out:])
    path = latent_rgb.save(factors, Path(args.out))
    print(f"{model.name}: {factors.channels} channels fitted on {factors.samples} latent pixels; held-out grey "
          f"correlation r = {factors.correlation:.3f}; wrote {path} (entry {factors.fingerprint})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
