"""What the step cache costs on the trained tiny model: ``python -m bench.step_cache_quality [--steps 30] [--json]``.

The demo prompt at two seeds (t2va, the tiny canvas, 5 s, float32 on the CPU), without LoRA and with each demo
adapter (unmerged, its registry alpha), run once uncached and once with ``--cache fbc`` at each threshold. Reports
the share of evaluations the first-block cache skipped, the PSNR of the decoded frames (dB, peak 1.0, over all
frames) and the SNR of the stereo audio (dB) against the uncached run. Deterministic on one machine; the mean share
at the default threshold is ``h3app.model.denoise_cache.MEASURED_SKIP_SHARE``, which the plan predicts cached runs
from (docs/performance.md quotes the table).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

PROMPT = "a red ball moving right over a grey floor, low loud hum"
SEEDS = (0, 7)
THRESHOLDS = (0.02, 0.05, 0.1)


def _adapters() -> dict[str, Any]:
    """Label → the adapter settings of each demo adapter (None: no LoRA)."""
    from h3app.model.repo import TINY_DIR
    from h3app.model.tiny_training.recipe import STYLE_FILE, TURBO_ALPHA, TURBO_FILE
    from h3app.settings import LoRASettings

    folder = TINY_DIR.parent / "adapters"
    return {"none": None, "style": LoRASettings(source=str(folder / STYLE_FILE)),
            "turbo": LoRASettings(source=str(folder / TURBO_FILE), alpha=TURBO_ALPHA)}


def measure(steps: int = 30, thresholds: tuple[float, ...] = THRESHOLDS) -> list[dict[str, Any]]:
    """One row per (adapter, seed, threshold): the skipped share and the distance to the uncached run."""
    from h3app.backend import generation
    from h3app.backend.adapter_binding import AdapterBinder
    from h3app.backend.generation import run_generation
    from h3app.backend.metrics import psnr, snr
    from h3app.model import denoise_cache
    from h3app.model.loader import load_model
    from h3app.request import GenerationRequest

    model = load_model("tiny")
    binder, pipe = AdapterBinder(model), model.pipeline()
    rows, step_cache = [], denoise_cache.step_cache
    try:
        for label, adapter in _adapters().items():
            binder.apply([adapter] if adapter is not None else [])
            for seed in SEEDS:
                request = GenerationRequest(prompt=PROMPT, seed=seed, steps=steps)
                plain = run_generation(pipe, request)
                for threshold in thresholds:
                    generation.step_cache = lambda t, kind, th=threshold: step_cache(t, kind, th)
                    cached = run_generation(pipe, dataclasses.replace(request, cache="fbc"))
                    record = cached.cache
                    rows.append({"lora": label, "seed": seed, "steps": steps, "threshold": threshold,
                                 "evaluations": record["evaluations"], "skipped": record["skipped"],
                                 "share": round(record["skipped"] / record["evaluations"], 3),
                                 "frames_psnr_db": round(psnr(plain.video, cached.video), 1),
                                 "audio_snr_db": round(snr(plain.audio, cached.audio), 1)})
    finally:
        generation.step_cache = step_cache
        binder.reset()
    return rows


def mean_share(rows: list[dict[str, Any]], threshold: float) -> float:
    """The mean skipped share of ``rows`` at ``threshold``."""
    shares = [r["share"] for r in rows if r["threshold"] == threshold]
    return round(sum(shares) / len(shares), 3)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as the Markdown table docs/performance.md quotes."""
    lines = ["| LoRA | seed | threshold | skipped | frames PSNR | audio SNR |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['lora']} | {r['seed']} | {r['threshold']:g} | {r['skipped']}/{r['evaluations']} "
              f"({r['share']:.0%}) | {r['frames_psnr_db']} dB | {r['audio_snr_db']} dB |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    from h3app.model.denoise_cache import FBC_THRESHOLD

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = measure(args.steps)
    share = mean_share(rows, FBC_THRESHOLD)
    print(json.dumps({"rows": rows, "mean_share": share}, indent=1) if args.json
          else f"{markdown(rows)}\n\nmean share skipped at threshold {FBC_THRESHOLD:g}: {share}")


if __name__ == "__main__":
    main()
