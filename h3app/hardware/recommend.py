"""The plan (``python -m h3app plan``): the judge's verdicts for one request on every flavor, the fastest placement
that fits each, and the Space flavor that makes a video for the fewest dollars, with the limits it holds.

Every number here comes from :func:`judge.judge`: the top-level fields for the placement asked for, ``flavors[].best``
for the fastest fitting placement of each flavor (``best: null``, no price, where none fits), and ``recommended``
for the lowest ``usd_per_video`` among Space flavors, with ``options`` (the flags ``app.py`` takes) and ``limits``
(``judge.limits``: the longest clip and the canvas that placement holds there). Flavors left out of ``recommended``
are listed with the reason (``left_out``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import H3AppError
from ..rules.choices import MERGED, OFFLOAD_MODES
from .flavors import FLAVORS, Flavor, flavor
from .judge import DEFAULT_SETUP, PREDICTION_FIELDS, PlannedRequest, Setup, Verdict, best, judge, limits, measured_for
from .planner import Measured, Placement, dtype_name, placed_weights, run_options
from .rehearsal import PLANNED_VAE_DTYPE


@dataclass
class Plan:
    """The plan for one request, setup and placement (the ``plan --json`` object)."""

    model: str
    request: dict[str, Any]
    workflow: str
    duration: float
    dtype: str
    placement: Placement
    lora_mode: str | None
    peak_gpu_bytes: int
    host_bytes: int
    components: dict[str, int]
    phases: dict[str, dict[str, int]]
    fits: dict[str, bool]
    flavors: list[dict[str, Any]]
    recommended: dict[str, Any] | None
    targets_bound: int | None
    tokens: dict[str, int]
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    flops_per_evaluation: int = 0  # one transformer evaluation, counted on the rehearsal (``work.py``)
    predicted: dict[str, dict[str, Any]] = field(default_factory=dict)  # fitting flavor → the prediction
    left_out: dict[str, str] = field(default_factory=dict)  # flavor → why it is not ``recommended``
    vae_dtype: str = dtype_name(PLANNED_VAE_DTYPE)  # what the video decoder computes in (``--vae-dtype`` resolved)
    attention: str = "auto"  # the ``--attention`` asked for; each prediction names the backend counted on its card

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["placement"] = asdict(self.placement)
        data["offload"], data["fp8"] = self.placement.offload, self.placement.fp8
        data["fp8_text_encoder"] = self.placement.fp8_text_encoder
        return data


def flavor_row(verdict: Verdict, best_verdict: Verdict | None, dtype: str, vae_dtype: str | None = None) -> dict[str, Any]:
    """One ``flavors`` row: the box's published numbers, the verdicts of the placement asked for, and ``best``."""
    box = verdict.box
    return {"name": box.name, "space_hardware": box.space_hardware, "gpu": box.gpu, "gpus": box.gpus,
            "gpu_bytes": box.gpu_bytes, "host_bytes": box.host_bytes, "usd_per_hour": box.usd_per_hour,
            "fits_gpu": verdict.fits_gpu, "fits_host": verdict.fits_host, "fits": verdict.fits,
            "best": best_verdict.best_json(dtype, vae_dtype) if best_verdict is not None else None}


def left_out_reason(box: Flavor, best_verdict: Verdict | None) -> str | None:
    """Why ``box`` cannot be ``recommended`` (None: it can)."""
    if box.zero_gpu:
        return "ZeroGPU: a daily quota per visitor, no hourly price to compare (docs/hardware.md, ZeroGPU)"
    if box.space_hardware is None:
        return "Jobs only: not a Space flavor"
    if best_verdict is None:
        return "no placement fits its GPU and host RAM"
    if (best_verdict.prediction or {}).get("usd_per_video") is None:
        return "no spec-sheet peaks for its GPU: no time or price to compare"
    return None


def recommendation(bests: dict[str, Verdict | None], setup: Setup, dtype: str,
                   with_limits: bool = True) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """The Space flavor whose best placement makes the request for the fewest dollars (ties: the cheaper hour),
    with its options and limits; and the reason each other flavor was left out."""
    left_out = {name: reason for name, v in bests.items()
                if (reason := left_out_reason(flavor(name), v)) is not None}
    # (verdict, its prediction): a flavor not left out has a placement and a price (``left_out_reason``)
    eligible = [(v, v.prediction) for name, v in bests.items()
                if name not in left_out and v is not None and v.prediction is not None]
    if not eligible:
        return None, left_out
    chosen, prediction = min(eligible, key=lambda vp: (vp[1]["usd_per_video"], vp[0].box.usd_per_hour,
                                                        vp[0].box.gpu_bytes))
    box, placement = chosen.box, chosen.placement
    out = {"hardware": box.name, "space_hardware": box.space_hardware, "offload": placement.offload,
           "fp8": placement.fp8, "fp8_text_encoder": placement.fp8_text_encoder, "ranks": placement.ranks, "ring": placement.ring,
           "options": run_options(placement, dtype, dtype_name(setup.vae_dtype)), "peak_gpu_bytes": chosen.peak_gpu_bytes,
           "gpu_bytes": box.gpu_bytes, "host_bytes": chosen.host_bytes, "host_ram_bytes": box.host_bytes,
           "usd_per_hour": box.usd_per_hour,
           **{key: prediction.get(key) for key in PREDICTION_FIELDS},
           "limits": limits(chosen.request, placement, box, setup) if with_limits else None}
    return out, left_out


def make_plan(request: PlannedRequest, placement: Placement, setup: Setup = DEFAULT_SETUP, *,
              hardware: str | None = None, with_limits: bool = True, measured: Measured | None = None) -> Plan:
    """Judge ``request`` with ``placement`` on every flavor (or only ``hardware``), find each flavor's best
    placement, recommend, and (``with_limits``) search the recommendation's limits. ``measured``: the request's
    rehearsal numbers when already at hand (default: ``judge.measured_for``)."""
    started = time.perf_counter()
    if placement.offload not in OFFLOAD_MODES:
        raise H3AppError(f"offload must be one of {', '.join(OFFLOAD_MODES)}, got {placement.offload!r}.")
    lora = setup.lora
    if placement.fp8 and lora == MERGED:
        raise H3AppError("fp8 storage keeps LoRA exact only unmerged (a merge would round into fp8): "
                         "use --lora-mode unmerged, or drop --fp8.")
    judged = (flavor(hardware),) if hardware else FLAVORS
    measured = measured or measured_for(request, setup)
    dtype = dtype_name(setup.dtype)
    verdicts = {box.name: judge(request, placement, box, setup, measured) for box in judged}
    bests = {box.name: best(request, box, setup, measured=measured) for box in judged}
    recommended, left_out = recommendation(bests, setup, dtype, with_limits)
    first = next(iter(verdicts.values()))
    rehearsal = measured.rehearsal
    components = placed_weights(measured, placement)
    if lora:
        components["lora_factors"] = measured.lora_bytes
    from .roofline import flops_per_evaluation

    return Plan(
        model=setup.model, request=request.to_json(), workflow=request.workflow, duration=round(request.duration, 4),
        dtype=dtype, placement=placement, lora_mode=lora, peak_gpu_bytes=first.peak_gpu_bytes,
        host_bytes=first.host_bytes, components=components, phases=first.phases,
        fits={name: v.fits for name, v in verdicts.items()},
        flavors=[flavor_row(verdicts[name], bests[name], dtype, dtype_name(setup.vae_dtype)) for name in verdicts],
        recommended=recommended, targets_bound=rehearsal.targets_bound if lora else None,
        tokens=dict(rehearsal.tokens), warnings=_warnings(verdicts, measured, placement, lora),
        seconds=round(time.perf_counter() - started, 2),
        flops_per_evaluation=sum(flops_per_evaluation(rehearsal).values()),
        predicted={name: v.prediction for name, v in verdicts.items() if v.fits and v.prediction is not None},
        left_out=left_out, vae_dtype=dtype_name(setup.vae_dtype), attention=setup.attention)


def _warnings(verdicts: dict[str, Verdict], measured: Any, placement: Placement, lora: str | None) -> list[str]:
    from ..rules.units import format_bytes

    first = next(iter(verdicts.values()))
    warnings = []
    if not any(v.fits_gpu for v in verdicts.values()):
        warnings.append(f"{placement.label} needs {format_bytes(first.peak_gpu_bytes)} on one GPU: no judged flavor "
                        f"has that much; see each flavor's `best` and `recommended`.")
    elif not any(v.fits for v in verdicts.values()):
        warnings.append(f"{placement.label} fits some GPUs but no box with {format_bytes(first.host_bytes)} of host "
                        f"RAM beside them; see each flavor's `best` and `recommended`.")
    if lora == MERGED:
        warnings.append(f"merged mode keeps pristine copies of the bound weights in host RAM "
                        f"({format_bytes(measured.rehearsal.pristine_host_bytes)}).")
    if placement.offload != "none":
        warnings.append(f"offload keeps the offloaded weights in host RAM "
                        f"({format_bytes(sum(placed_weights(measured, placement).values()))}): the box needs that "
                        f"much free.")
    return warnings
