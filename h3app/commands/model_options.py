"""Command-line flags that choose and place the model, shared by the commands that load one.

Light on purpose: every command's parser is built on each start, so nothing here imports torch."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import H3AppError
from ..model.repo import TINY
from ..parallel.topology import add_parallel_arguments
from ..rules import values
from ..rules.attention import ATTENTION_CHOICES, AUTO, RING, ULYSSES
from ..rules.canvas import check_canvas
from ..rules.choices import (
    DTYPE_NAMES,
    LORA_MODES,
    NO_CACHE,
    OFFLOAD_MODES,
    STEP_CACHES,
    UNMERGED,
    VAE_AUTO,
    VAE_DTYPES,
    WORKFLOWS,
)
from ..rules.frames import RELEASED
from ..rules.request_defaults import FULL_DEFAULTS, TINY_DEFAULTS, defaults_for, known_canvas
from ..rules.steps import MIN_STEPS
from ..settings import ADVANCED_FIELDS, ALIASES, FACTOR, KNOBS, LoRASettings
from .flag_values import dtype_name

if TYPE_CHECKING:
    from ..model.loader import LoadOptions
    from ..settings import LoRASettings


def add_model_flags(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument("--model", default=None if required else os.environ.get("H3APP_MODEL", TINY),
                        required=required,
                        help="`tiny` (embedded checkpoint), a local folder, or a Hub repo id such as MiniMaxAI/MiniMax-H3")
    parser.add_argument("--model-revision", default=None, help="Hub revision of the model (branch, tag or commit)")
    parser.add_argument("--dtype", default="float32", type=dtype_name, help=f"{' | '.join(DTYPE_NAMES)} (float32 on CPU, bfloat16 on GPU)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 …")
    parser.set_defaults(loads_model_here=True)  # --model and --device name this machine's: cli.refuse_before_libraries
    parser.add_argument("--offload", default="none", choices=OFFLOAD_MODES,
                        help="none | auto (ComponentsManager CPU offload) | group (transformer block offload)")
    parser.add_argument("--fuse-qkv", action="store_true", help="fuse q/k/v at load time (frees the split weights)")
    add_fp8_flags(parser)
    add_compile_flag(parser)
    add_vae_dtype_flag(parser)
    add_attention_flag(parser)


# --attention (docs/performance.md, "Attention"): the same flag on app.py, generate, check and grid; parsed by
# argparse's choices, so a bad value is one line before torch is imported
def add_attention_flag(parser: argparse.ArgumentParser, default: str = AUTO) -> None:
    parser.add_argument("--attention", default=default, choices=ATTENTION_CHOICES,
                        help="attention backend: auto (the fastest exact one installed for the GPU: FlashAttention "
                             "3 on Hopper, cuDNN on Blackwell, SDPA elsewhere and on the CPU), or sdpa, fa3, flash, "
                             "cudnn, sage (approximate: never chosen by auto; the check refuses it)")


def split_of(args: argparse.Namespace) -> str:
    """How ``--ulysses``/``--ring`` split the sequence (``rules.attention.ULYSSES``/``RING``), "" for one rank."""
    if (getattr(args, "ring", None) or 1) > 1:
        return RING
    return ULYSSES if (getattr(args, "ulysses", None) or 1) > 1 else ""


# --vae-dtype and --cache (docs/performance.md): the same flags on generate, check, grid and plan
def add_vae_dtype_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vae-dtype", default=VAE_AUTO, choices=VAE_DTYPES,
                        help="what the video decoder computes in (its norms, the encoder and the audio decoder stay "
                             "float32); auto (default): bfloat16 on a CUDA GPU, as the fast engines decode, float32 "
                             "on the CPU (docs/performance.md)")


def add_cache_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache", default=NO_CACHE, choices=STEP_CACHES,
                        help="step cache: none, or fbc (diffusers' first-block cache: an evaluation whose first block "
                             "barely moved skips the others; docs/performance.md)")


# --- fp8 storage (docs/hardware.md): the same flags and variables on app.py, generate, check, grid and plan ---
FP8_ENV = "H3APP_FP8"
FP8_TEXT_ENCODER_ENV = "H3APP_FP8_TEXT_ENCODER"


def env_flag(name: str) -> bool:
    """A boolean environment variable: ``1``/``true``/``yes`` (any case) is on, unset or anything else off."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def add_fp8_flags(parser: argparse.ArgumentParser) -> None:
    """``--fp8`` (transformer weights) and ``--fp8-text-encoder`` (the conditioner's decoder layers) stored
    ``float8_e4m3fn``, computed in ``--dtype``; defaults from ``H3APP_FP8`` / ``H3APP_FP8_TEXT_ENCODER``."""
    parser.add_argument("--fp8", action="store_true", default=env_flag(FP8_ENV),
                        help=f"store the transformer's weights in float8_e4m3fn, compute in --dtype (diffusers' "
                             f"layerwise casting; LoRA unmerged only; env {FP8_ENV}=1)")
    parser.add_argument("--fp8-text-encoder", action="store_true", default=env_flag(FP8_TEXT_ENCODER_ENV),
                        help=f"store the Qwen3-VL conditioner's decoder layers in float8_e4m3fn "
                             f"(env {FP8_TEXT_ENCODER_ENV}=1)")


# --compile: torch.compile on the transformer blocks (h3app/model/compiled.py); the JSON reports dynamo's counts.
def add_compile_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the transformer blocks (inductor on CUDA, aot_eager on CPU); "
                             "LoRA setting changes do not recompile")


def compile_fields(args: argparse.Namespace) -> dict[str, Any]:
    """``{"compile": {graphs, recompiles}}`` for a command run with ``--compile``, else nothing."""
    if not getattr(args, "compile", False):
        return {}
    from ..model.compiled import compile_report

    return {"compile": compile_report()}


def add_adapter_flags(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """``--adapter SOURCE [--weight-name F] [--revision R]``: one adapter, as every command names it."""
    parser.add_argument("--adapter", default=None, required=required,
                        help="LoRA: Hub repo id, HF URL, or local file/folder")
    parser.add_argument("--weight-name", default=None, help="file inside the adapter repo/folder when it holds several")
    parser.add_argument("--revision", default=None, help="Hub revision of the adapter (branch, tag or commit)")
    add_part_flags(parser)


def add_part_flags(parser: argparse.ArgumentParser) -> None:
    """``--skip-parts KIND`` (repeatable; ``adaln``: leave out a pruned-base file's AdaLN parts) and
    ``--any-partition`` (apply a file made for the other transformer partition): docs/adapters.md."""
    parser.add_argument("--skip-parts", action="append", default=[], metavar="KIND",
                        help="leave these parts of the adapter out (adaln: the AdaLN parts of a file built for a "
                             "pruned H3 checkpoint); repeatable")
    parser.add_argument("--any-partition", action="store_true",
                        help="apply an adapter made for the other transformer partition (FL2VA vs Ref2VA) anyway")


def add_lora_mode_flag(parser: argparse.ArgumentParser, mode_alias: bool = True) -> None:
    """``--lora-mode unmerged|merged`` (``args.lora_mode``). ``mode_alias``: ``--mode`` stays a hidden alias (on
    generate and grid, so scripts written before ``--lora-mode`` keep working; ``check --mode`` is the check's)."""
    parser.add_argument("--lora-mode", default=UNMERGED, choices=LORA_MODES,
                        help="how LoRA is applied" + (" (--mode: deprecated alias)" if mode_alias else ""))
    if mode_alias:
        parser.add_argument("--mode", dest="lora_mode", default=argparse.SUPPRESS, choices=LORA_MODES,
                            help=argparse.SUPPRESS)


def add_run_flags(parser: argparse.ArgumentParser, adapter_required: bool = True) -> None:
    """The flags of a command that runs the model on an adapter (generate, check, grid): the model and its
    placement, ``--ulysses``/``--ring``, ``--adapter`` and its advanced strengths."""
    add_model_flags(parser)
    add_parallel_arguments(parser)
    add_adapter_flags(parser, required=adapter_required)
    add_strength_flags(parser)


# --- advanced strength of --adapter (docs/lora-engine.md "Advanced strength"): every flag and --adapter-spec key
# comes from the settings schema (``h3app.settings.KNOBS``)
def add_strength_flags(parser: argparse.ArgumentParser) -> None:
    """Per-modality strength, a strength schedule and per-block strength for ``--adapter`` (unmerged; the values
    are parsed by ``h3app.rules``: one line for a bad one)."""
    group = parser.add_argument_group("advanced strength of --adapter (unmerged; docs/lora-engine.md)")
    for knob in KNOBS:
        group.add_argument(knob.flag, dest=knob.name, default=None, help=knob.help,
                           metavar="F" if knob.kind == FACTOR else knob.key.upper())


def strength_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The advanced-strength flags given on the command line, as ``LoRASettings`` fields."""
    return {k.name: getattr(args, k.name) for k in KNOBS if getattr(args, k.name, None) is not None}


def check_strengths(args: argparse.Namespace, **fields: Any) -> None:
    """The advanced-strength flags of ``--adapter``, checked as ``LoRASettings`` checks them (``rules``' parsers):
    a bad value is one line before torch is imported (a command's ``check``)."""
    LoRASettings(source=args.adapter, **fields, **strength_fields(args))


SPEC_FIELDS = ("weight_name", "revision", "alpha", "strength", *ADVANCED_FIELDS)  # what --adapter-spec may set
SPEC_KEYS = {key: name for key, name in ALIASES.items() if name in SPEC_FIELDS}  # spec key → LoRASettings field
SPEC_WORDS = ", ".join(min((k for k, n in SPEC_KEYS.items() if n == name), key=len) + "=" for name in SPEC_FIELDS)
LIST_FIELDS = tuple(k.name for k in KNOBS if k.kind != FACTOR)  # their values hold commas: later parts continue them


def parse_adapter_spec(spec: str, mode: str) -> LoRASettings:
    """``"SOURCE,weight=F,rev=R,alpha=A,scale=S,audio=0,schedule=1,1,0.5,blocks=0-9:0.5"`` → LoRASettings (SOURCE
    first; the rest optional, any order; a part without ``=`` after ``schedule=``/``blocks=`` continues its list).
    Each value is parsed once, by ``LoRASettings`` (a bad one: one line naming its key)."""
    parts = [part.strip() for part in spec.split(",")]
    if not parts or not parts[0] or "=" in parts[0]:
        raise H3AppError(f'--adapter-spec must start with the source, e.g. "repo/name,alpha=8,scale=1", got {spec!r}.')
    fields: dict[str, Any] = {}  # LoRASettings' keyword arguments
    keys: dict[str, str] = {}  # field → the key it was given as (for a refusal)
    last = ""  # the field the previous part set
    for part in parts[1:]:
        key, sep, value = part.partition("=")
        if not sep and last in LIST_FIELDS:
            fields[last] += "," + part
            continue
        if not sep or key.strip() not in SPEC_KEYS:
            raise H3AppError(f"--adapter-spec: unknown field {values.short(part)}; use {SPEC_WORDS}.")
        name = last = SPEC_KEYS[key.strip()]
        keys[name], text = key.strip(), value.strip()
        fields[name] = None if not text and name in ("weight_name", "revision") else text
    try:
        return LoRASettings(source=parts[0], mode=mode, **fields)
    except H3AppError as error:
        given = ", ".join(f"{keys[name]}={fields[name]}" for name in keys)
        raise H3AppError(f"--adapter-spec ({given}): {error}") from None


def load_options(args: argparse.Namespace) -> LoadOptions:
    """The flags as :class:`LoadOptions` (checked: an unknown dtype or a device this machine lacks is one line)."""
    from ..model.loader import LoadOptions, parse_dtype

    return LoadOptions(dtype=parse_dtype(args.dtype), device=args.device, offload=args.offload, fp8=args.fp8,
                       fp8_text_encoder=args.fp8_text_encoder, fuse_qkv=args.fuse_qkv,
                       revision=args.model_revision, token=os.environ.get("HF_TOKEN"),
                       compile=getattr(args, "compile", False),
                       vae_dtype=getattr(args, "vae_dtype", VAE_AUTO),  # auto: resolved for --device
                       attention=getattr(args, "attention", AUTO), split=split_of(args))


# --- the request's size: the same flags and the same checks on generate, grid and plan (torch-free) -----------
def add_request_flags(parser: argparse.ArgumentParser, workflow: bool = True) -> None:
    """``[--workflow W] [--steps N] [--duration S | --frames F] [--height H --width W]``; None: the default (a
    known adapter's preset, else the model's, ``rules.request_defaults``)."""
    if workflow:
        parser.add_argument("--workflow", default=None, choices=WORKFLOWS,
                            help="t2va (text), fl2va (first/last keyframe), ref2va (references); default: the known "
                                 "adapter's, else t2va")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"num_inference_steps: sigma points including the terminal one, so N steps = N-1 "
                             f"evaluations (default: the known adapter's preset, else the model's: "
                             f"{FULL_DEFAULTS.steps} full, {TINY_DEFAULTS.steps} tiny)")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--duration", type=float, default=None,
                        help=f"seconds, {RELEASED.describe()}; default {FULL_DEFAULTS.duration:g}")
    length.add_argument("--frames", type=int, default=None,
                        help="the clip's length in frames instead (snapped up to 17n+5)")
    parser.add_argument("--height", type=int, default=None,
                        help="pixels, a multiple of the model's canvas multiple (default: the model's canvas)")
    parser.add_argument("--width", type=int, default=None)


@dataclass(frozen=True)
class RequestFlags:
    """The request flags, checked: ``duration`` in seconds (``--frames`` converted), None where the default
    applies (``steps``: a preset may still set it; ``height``/``width``: the pipeline's canvas)."""

    workflow: str | None
    steps: int | None
    duration: float
    height: int | None
    width: int | None

    @property
    def canvas(self) -> tuple[int, int] | None:
        """``(height, width)`` as given (``request_flags`` takes both or neither), None: the default canvas."""
        return (self.height, self.width) if self.height is not None and self.width is not None else None


def request_flags(args: argparse.Namespace, model: str | None) -> RequestFlags:
    """``args``' request flags for ``model``, refused in one line before any model (or torch) loads: steps out of
    range, a clip shorter or longer than the pipeline makes, one side of a canvas, or a canvas ``model``'s pipeline
    refuses (known before loading for ``tiny`` and the published model)."""
    from ..backend.limits import MAX_STEPS

    steps = getattr(args, "steps", None)
    if steps is not None and not MIN_STEPS <= steps <= MAX_STEPS:
        raise H3AppError(f"--steps must be between {MIN_STEPS} and {MAX_STEPS} (N steps run N-1 evaluations), "
                         f"got {steps}.")
    duration = defaults_for(model).duration if args.duration is None else args.duration
    if getattr(args, "frames", None) is not None:
        frames = RELEASED.aligned(args.frames) if args.frames > 0 else args.frames
        if not RELEASED.frames(RELEASED.shortest_seconds) <= frames <= RELEASED.max_frames:
            raise H3AppError(f"--frames must give a clip of {RELEASED.describe()}, got {args.frames}.")
        duration = frames / RELEASED.fps
    RELEASED.check_duration(duration, "--duration")
    height, width = args.height, args.width
    if (height is None) != (width is None):
        raise H3AppError("give both --height and --width, or neither (then the model's default canvas is used).")
    canvas = known_canvas(model)
    if height is not None and width is not None and canvas is not None:
        check_canvas(height, width, canvas.canvas_multiple, canvas.max_pixels, names=("--height", "--width"))
    return RequestFlags(getattr(args, "workflow", None), steps, duration, height, width)
