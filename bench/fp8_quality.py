"""What fp8 storage costs on the trained tiny model: ``python -m bench.fp8_quality [--steps 5] [--json]``.

The same request (the demo prompt, seed 0, t2va, the tiny canvas, 5 s) on the embedded tiny checkpoint, loaded
three ways on the CPU in float32 compute: full precision; ``--fp8`` (transformer weights ``float8_e4m3fn``); and
``--fp8 --fp8-text-encoder`` (the conditioner's decoder layers too). Reports the PSNR of the decoded frames (dB,
peak 1.0, over all frames) and the SNR of the stereo audio (dB) of each fp8 run against the full-precision one,
with and without the trained Turbo LoRA (unmerged, its registry alpha). Quality numbers, not timings: they are
deterministic on one machine. docs/hardware.md quotes them.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

PROMPT = "a red ball moving right over a grey floor, low loud hum"
VARIANTS = {"--fp8": {"fp8": True}, "--fp8 --fp8-text-encoder": {"fp8": True, "fp8_text_encoder": True}}


def _outputs(fields: dict[str, Any], steps: int, lora: bool) -> tuple[Any, Any]:
    """(video [F, H, W, 3] in [0, 1], audio [2, S]) of one generation on the tiny model loaded with ``fields``."""
    from h3app.backend.generation import run_generation
    from h3app.model.loader import LoadOptions, load_model
    from h3app.request import GenerationRequest
    from h3app.rules.choices import T2VA

    model = load_model("tiny", options=LoadOptions(**fields))
    if lora:
        from h3app.backend.adapter_binding import AdapterBinder
        from h3app.model.repo import TINY_DIR
        from h3app.model.tiny_training.recipe import TURBO_ALPHA, TURBO_FILE
        from h3app.settings import LoRASettings

        AdapterBinder(model).apply([LoRASettings(source=str(TINY_DIR.parent / "adapters" / TURBO_FILE),
                                                 alpha=TURBO_ALPHA)])
    result = run_generation(model.pipeline(T2VA), GenerationRequest(prompt=PROMPT, seed=0, steps=steps))
    return result.video, result.audio


def measure(steps: int = 5) -> list[dict[str, Any]]:
    """One row per (LoRA or not, fp8 variant): PSNR of frames and SNR of audio against full precision."""
    from h3app.backend.metrics import psnr, snr

    rows = []
    for lora in (False, True):
        video, audio = _outputs({}, steps, lora)
        for label, fields in VARIANTS.items():
            fp8_video, fp8_audio = _outputs(fields, steps, lora)
            rows.append({"options": label, "lora": "turbo (unmerged)" if lora else "none", "steps": steps,
                         "frames_psnr_db": round(psnr(video, fp8_video), 1),
                         "audio_snr_db": round(snr(audio, fp8_audio), 1)})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as the Markdown table docs/hardware.md quotes."""
    lines = ["| options | LoRA | frames PSNR | audio SNR |", "|---|---|---|---|"]
    lines += [f"| `{r['options']}` | {r['lora']} | {r['frames_psnr_db']} dB | {r['audio_snr_db']} dB |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = measure(args.steps)
    print(json.dumps(rows, indent=1) if args.json else markdown(rows))


if __name__ == "__main__":
    main()
