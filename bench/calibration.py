"""``python -m bench.calibration [--write]``: every published MiniMax H3 run beside the plan's prediction for the
closest configuration the app can run, and their ratio — docs/hardware.md's calibration table, regenerated.

Each prediction is ``plan --json`` (the ``plan`` command's own parser, ``plan_options`` and ``make_plan``, in this
process) for the row's flags: the published request (t2va, 1344×768, 124 frames, 50 steps, bf16) on the flavor with
the sources' GPU count, at the app's defaults otherwise. The sources decode their video VAE in bf16, as the app does
on a GPU by default (``--vae-dtype auto``); vLLM-Omni's tensor parallel has no counterpart here, so its rows are set
beside Ulysses over the same GPUs with the placement that fits them. A run the app has no box for (16 GPUs, B300, an
RTX 4090) keeps its row with no prediction. ``denoise`` is the plan's ``evaluations × step_s`` (50 steps are 49 evaluations).

``--write`` replaces the table between the markers in docs/hardware.md; ``tests/test_bench_calibration.py`` holds
the docs to this output. No GPU is needed: the plan rehearses on fake CUDA (~1 minute on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1] / "docs" / "hardware.md"
START = "<!-- calibration table: python -m bench.calibration --write -->"
END = "<!-- end of the calibration table -->"
DECODE_START = "<!-- decode table: python -m bench.calibration --write -->"
DECODE_END = "<!-- end of the decode table -->"
DECODE_CARDS = ("rtx-pro-6000", "h200", "a100-large")  # one GPU each: the decode on one rank
VAE_DTYPES = {"float32": "fp32 (`--vae-dtype float32`: both VAEs loaded fp32, diffusers' pin; the CPU's default)",
              "bfloat16": "bf16 (the default on a GPU, `--vae-dtype auto`; what `load_components(dtype=torch.bfloat16)` "
                          "gives)"}
REQUEST = ("--steps", "50", "--no-limits")  # the published request; everything else at the app's defaults
SGLANG = "sglang cookbook, MiniMax-H3 §9"
VLLM = "vLLM-Omni recipe, RTX PRO 6000"
SGLANG_STACK = "FA3 (app: cuDNN under Ulysses); fused norm/RoPE kernels (app: decomposed, counted)"
VLLM_STACK = "TP2 × Ulysses (app: Ulysses only); bf16 weights (app: fp8 storage to fit 96 GB)"


@dataclass(frozen=True)
class Published:
    """One published number: ``measure`` is ``denoise``, ``step``, ``decode`` or ``video`` (end to end), in
    seconds; ``flags`` the plan flags of the closest configuration the app runs (None: none, ``why`` says why)."""

    source: str
    run: str
    measure: str
    seconds: float
    flags: tuple[str, ...] | None
    stack: str
    why: str = ""


def _rows(source: str, run: str, flags: tuple[str, ...] | None, stack: str, why: str = "",
          **measures: float) -> list[Published]:
    return [Published(source, run, measure, seconds, flags, stack, why) for measure, seconds in measures.items()]


def h200(gpus: int) -> tuple[str, ...]:
    return ("--hardware", f"h200x{gpus}", "--ulysses", str(gpus), "--offload", "none")


def rtx(gpus: int) -> tuple[str, ...]:
    return ("--hardware", f"rtx-pro-6000x{gpus}", "--ulysses", str(gpus), "--offload", "none", "--fp8",
            "--fp8-text-encoder")


PUBLISHED: tuple[Published, ...] = (
    *_rows(SGLANG, "4× H200, Ulysses 4, warmed", h200(4), SGLANG_STACK, denoise=71.73, decode=1.32, video=74.38),
    *_rows(SGLANG, "4× H200, TP2 + Ulysses 2, warmed", h200(4), SGLANG_STACK + "; TP2 (app: Ulysses 4)",
           denoise=75.52, decode=1.29, video=78.33),
    *_rows(SGLANG, "4× H200, Ulysses 4, first request cold", h200(4), SGLANG_STACK + "; cold (the plan: warmed)",
           denoise=79.04, decode=3.77, video=84.14),
    *_rows(SGLANG, "8× H200, Ulysses 8", h200(8), SGLANG_STACK, step=0.749),
    *_rows(SGLANG, "2 nodes × 8× H200, Ulysses 8 × Ring 2", None, SGLANG_STACK,
           "16 GPUs over InfiniBand: no flavor has more than 8", step=0.477),
    *_rows(SGLANG, "8× B300, Ulysses 8, fl2va", None, SGLANG_STACK, "no B300 flavor", video=19.04),
    *_rows(SGLANG, "1× RTX 4090 24 GB, layerwise offload", None, SGLANG_STACK,
           "no 24 GB box holds the request here", denoise=1008.6),
    *_rows(VLLM, "2× RTX PRO 6000, TP2 × Ulysses 1", rtx(2), VLLM_STACK, denoise=278.55, decode=5.396, video=284.76),
    *_rows(VLLM, "4× RTX PRO 6000, TP2 × Ulysses 2", rtx(4), VLLM_STACK, denoise=168.73, decode=2.791, video=172.32),
    *_rows(VLLM, "8× RTX PRO 6000, TP2 × Ulysses 4", rtx(8), VLLM_STACK, denoise=87.90, decode=1.798, video=90.48),
)


def plan_json(flags: Sequence[str], attention: str | None = None) -> dict[str, Any]:
    """``python -m h3app plan <flags> --json``'s object, made in this process (``attention``: the ``--attention``
    value to plan with, where it differs from the default)."""
    from h3app.cli import build_parser
    from h3app.commands.plan import plan_options
    from h3app.hardware.recommend import make_plan

    args = build_parser().parse_args(["plan", *flags, "--json"])
    request, placement, setup = plan_options(args)
    if attention is not None:
        setup = replace(setup, attention=attention)
    return make_plan(request, placement, setup, hardware=args.hardware, with_limits=not args.no_limits).to_json()


def predicted(flags: tuple[str, ...], plans: dict[tuple[str, ...], dict[str, Any]]) -> dict[str, Any]:
    """The prediction of ``flags`` on its flavor (each distinct plan made once)."""
    key = flags + REQUEST
    if key not in plans:
        plans[key] = plan_json(key)
    plan = plans[key]
    hardware = flags[flags.index("--hardware") + 1]
    return plan["predicted"][hardware]


def seconds_of(measure: str, prediction: dict[str, Any]) -> float:
    """The plan's figure for a published ``measure``."""
    if measure == "denoise":
        return prediction["evaluations"] * prediction["step_s"]
    return float(prediction[{"step": "step_s", "decode": "decode_s", "video": "video_s"}[measure]])


def markdown(rows: Sequence[Published] = PUBLISHED) -> str:
    """The calibration table: one line per published run, each measure as ``published → plan (plan ÷
    published)``, then the differences in stack."""
    plans: dict[tuple[str, ...], dict[str, Any]] = {}
    runs: dict[tuple[str, str], list[Published]] = {}
    for row in rows:
        runs.setdefault((row.source, row.run), []).append(row)
    lines = ["| source | published run | app's closest configuration (`plan` flags) | denoise or step | decode | "
             "end to end | differences in stack |", "|---|---|---|---|---|---|---|"]
    for (source, run), measures in runs.items():
        first = measures[0]
        prediction = predicted(first.flags, plans) if first.flags is not None else None
        where = (f"`{' '.join(first.flags)}`, attention {prediction['attention']}" if prediction is not None
                 else f"— ({first.why})")
        cells = {"step": "", "decode": "", "video": ""}
        for row in measures:
            column = "step" if row.measure in ("denoise", "step") else row.measure
            label = "denoise " if row.measure == "denoise" else ""
            if prediction is None:
                cells[column] = f"{label}{row.seconds:g} s"
                continue
            plan = seconds_of(row.measure, prediction)
            cells[column] = f"{label}{row.seconds:g} s → {plan:.3g} s ({plan / row.seconds:.2f}×)"
        lines.append(f"| {source} | {run} | {where} | {cells['step']} | {cells['decode']} | {cells['video']} | "
                     f"{first.stack} |")
    return "\n".join(lines)


def step_account(flags: tuple[str, ...] = h200(4)) -> str:
    """Where one evaluation of ``flags`` goes (``roofline.step_terms``), and the step with SDPA instead of the
    planned backend: the app's own costs the sources' stacks do not pay."""
    from h3app.cli import build_parser
    from h3app.commands.plan import plan_options
    from h3app.hardware.flavors import flavor
    from h3app.hardware.judge import measured_for
    from h3app.hardware.roofline import PEAKS, step_terms

    args = build_parser().parse_args(["plan", *flags, *REQUEST])
    request, placement, setup = plan_options(args)
    box = flavor(args.hardware)
    peaks = PEAKS[box.gpu]
    terms = step_terms(measured_for(request, setup), placement, peaks)
    sdpa, fa3 = predicted_with(flags, "sdpa"), predicted_with(flags, "fa3")
    planned = predicted_with(flags, None)
    parts = ", ".join(f"{name.removesuffix('_s').replace('_', ' ')} {value:.3f} s" for name, value in terms.items())
    step = planned["step_s"]
    eager = terms["memory_bound_s"] + terms["launches_s"]
    return (f"`{' '.join(flags)}`, one evaluation ({step:.3f} s): {parts} (the weights' read hides under the "
            f"compute). The eager memory-bound ops and launches, which sglang's fused kernels largely avoid, are "
            f"{eager:.3f} s ({eager / step:.0%} of the step). With sglang's FA3 (diffusers 0.42.1 does not run it "
            f"under Ulysses) the step would be {fa3['step_s']:.3f} s ({fa3['step_s'] / step:.2f}×); with SDPA "
            f"instead of {planned['attention']} (what runs where the card's pick cannot) {sdpa['step_s']:.3f} s "
            f"({sdpa['step_s'] / step:.2f}×).")


def predicted_with(flags: tuple[str, ...], attention: str | None) -> dict[str, Any]:
    hardware = flags[flags.index("--hardware") + 1]
    return plan_json(flags + REQUEST, attention)["predicted"][hardware]


def decode_table() -> str:
    """The video and audio decode of the default request (1344×768, 124 frames) on one GPU of each of
    :data:`DECODE_CARDS`, per decoder dtype: ``plan --hardware CARD --vae-dtype D --json``'s ``best.decode_s``."""
    lines = [f"| video decoder, 1344×768, 124 frames | {' | '.join(DECODE_CARDS)} |",
             f"|---|{'---|' * len(DECODE_CARDS)}"]
    for dtype, words in VAE_DTYPES.items():
        cells = []
        for card in DECODE_CARDS:
            best = plan_json(("--hardware", card, "--vae-dtype", dtype, "--no-limits"))["flavors"][0]["best"]
            cells.append(f"{best['decode_s']:.1f} s" if best is not None else "nothing fits")
        lines.append(f"| {words} | {' | '.join(cells)} |")
    return "\n".join(lines)


def document() -> str:
    """The calibration block: the table and the step's account."""
    return f"{markdown()}\n\n{step_account()}"


def blocks() -> dict[tuple[str, str], str]:
    """Each generated block of docs/hardware.md by its markers."""
    return {(START, END): document(), (DECODE_START, DECODE_END): decode_table()}


def write(path: Path = DOCS) -> None:
    """Replace the text between each pair of markers in ``path`` with its block (:func:`blocks`)."""
    text = path.read_text()
    for (start, end), block in blocks().items():
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{start}\n{block}\n{end}{tail}"
    path.write_text(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.calibration", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="replace the table in docs/hardware.md")
    args = parser.parse_args(argv)
    if args.write:
        write()
    else:
        print("\n\n".join(blocks().values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
