"""What a bf16 video decoder costs on the trained tiny model: ``python -m bench.vae_dtype_quality [--json]``.

The demo prompt at two seeds (t2va, the tiny canvas, 5 s, the tiny model's 5 steps, float32 everywhere else on the
CPU), decoded by the video VAE loaded in float32 (diffusers' pin; ``--vae-dtype auto`` on the CPU) and in bf16 (what
``auto`` loads on a GPU, or ``--vae-dtype bfloat16``: the decoder's linears and attention in bf16; its norms, layer
scales and the encoder in fp32, as diffusers keeps them; the audio VAE in fp32 either way). Reports the PSNR of the bf16 frames against the fp32 ones (dB, peak 1.0,
over all frames, and the worst frame), the largest difference of a pixel, and whether the audio is bit-identical.
docs/performance.md quotes the table. The tiny decoder has 2 layers of width 16; the released one 36 of width 2048,
so this measures the path, not the released decoder's error.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

PROMPT = "a red ball moving right over a grey floor, low loud hum"
SEEDS = (0, 7)


def measure() -> list[dict[str, Any]]:
    """One row per seed: bf16 decode against fp32 decode of the same latents."""
    import torch

    from h3app.backend.generation import run_generation
    from h3app.backend.metrics import per_frame_psnr, psnr
    from h3app.model.loader import LoadOptions, load_model
    from h3app.request import GenerationRequest

    fp32, bf16 = (load_model("tiny", options=LoadOptions(vae_dtype=dtype)) for dtype in (torch.float32, torch.bfloat16))
    rows = []
    for seed in SEEDS:
        request = GenerationRequest(prompt=PROMPT, seed=seed)
        a, b = run_generation(fp32.pipeline(), request), run_generation(bf16.pipeline(), request)
        rows.append({"seed": seed, "frames_psnr_db": round(psnr(a.video, b.video), 1),
                     "worst_frame_psnr_db": round(min(per_frame_psnr(a.video, b.video)), 1),
                     "max_abs_diff": round(float(abs(a.video - b.video).max()), 4),
                     "audio_identical": bool((a.audio == b.audio).all())})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| seed | frames PSNR (bf16 vs fp32) | worst frame | largest pixel difference | audio |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['seed']} | {r['frames_psnr_db']} dB | {r['worst_frame_psnr_db']} dB | {r['max_abs_diff']} "
              f"({r['max_abs_diff'] * 255:.1f}/255) | {'bit-identical' if r['audio_identical'] else 'differs'} |"
              for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    rows = measure()
    print(json.dumps(rows, indent=1) if parser.parse_args().json else markdown(rows))


if __name__ == "__main__":
    main()
