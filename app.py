"""H3 LoRA Lab — run the app: `python app.py [--model tiny|FOLDER|REPO_ID] [--ulysses N] [--compile] [--mcp]`.

Host and port come from Gradio's own variables (GRADIO_SERVER_NAME, GRADIO_SERVER_PORT). Model and placement: what
--model/--device/--dtype/--offload/--fp8/--fp8-text-encoder/--ulysses/--ring or their H3APP_* variables set, the
rest chosen for the box (``h3app.hardware.auto``: on a CUDA box MiniMaxAI/MiniMax-H3 in bf16, placed as fast as
its GPUs and host RAM allow; without one the embedded tiny checkpoint on the CPU). Hosted mode, adapter size cap
and output folder from H3APP_HOSTED, H3APP_MAX_ADAPTER_MB and H3APP_OUTPUT_DIR. README.md lists every variable.
"""

import argparse
import os
import sys

from h3app.cli import quiet_libraries, refuse_before_libraries
from h3app.commands.model_options import (
    FP8_ENV,
    FP8_TEXT_ENCODER_ENV,
    add_attention_flag,
    add_compile_flag,
    add_fp8_flags,
    add_vae_dtype_flag,
    split_of,
)
from h3app.errors import H3AppError
from h3app.parallel.topology import add_parallel_arguments
from h3app.rules.choices import VAE_AUTO


def use_persistent_storage() -> None:
    """On a Space with persistent storage (/data), keep the Hugging Face cache there: ~124 GB of weights are
    downloaded once, not on every restart."""
    if "HF_HOME" not in os.environ and os.path.isdir("/data") and os.access("/data", os.W_OK):
        os.environ["HF_HOME"] = "/data/.huggingface"


def main() -> None:
    """Start the app, or refuse with one line on stderr and exit status 2 (a bad flag, no GPU, a model that cannot
    be found or loaded), like every ``python -m h3app`` command."""
    try:
        serve()
    except H3AppError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def _env(name: str) -> str | None:
    """An ``H3APP_*`` variable, None when unset or empty (then the app chooses for the box)."""
    value = os.environ.get(name, "").strip()
    return value or None


def _env_flag(name: str) -> bool | None:
    value = _env(name)
    return None if value is None else value.lower() in ("1", "true", "yes")


def _env_int(name: str) -> int | None:
    value = _env(name)
    try:
        return None if value is None else int(value)
    except ValueError:
        raise H3AppError(f"{name} must be a whole number such as 2, got {value!r}.") from None


def build_parser() -> argparse.ArgumentParser:
    """The app's flags; each defaults from its environment variable, and one left unset (None) is chosen for the
    box by ``h3app.hardware.auto``."""
    parser = argparse.ArgumentParser(description="H3 LoRA Lab web app")
    parser.add_argument("--model", default=_env("H3APP_MODEL"),
                        help="tiny, a local folder or a Hub repo id (default: MiniMaxAI/MiniMax-H3 on a CUDA box, "
                             "tiny without one)")
    parser.add_argument("--dtype", default=_env("H3APP_DTYPE"), help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--device", default=_env("H3APP_DEVICE"), help="default: cuda when a GPU is seen, else cpu")
    parser.add_argument("--offload", default=_env("H3APP_OFFLOAD"),
                        help="none | auto | group (default: the fastest placement that fits this box)")
    add_fp8_flags(parser)  # --fp8, --fp8-text-encoder (H3APP_FP8, H3APP_FP8_TEXT_ENCODER)
    parser.set_defaults(fp8=_env_flag(FP8_ENV), fp8_text_encoder=_env_flag(FP8_TEXT_ENCODER_ENV))
    add_parallel_arguments(parser)
    parser.set_defaults(ulysses=_env_int("H3APP_ULYSSES"), ring=_env_int("H3APP_RING"))
    add_compile_flag(parser)
    add_vae_dtype_flag(parser)
    parser.set_defaults(vae_dtype=_env("H3APP_VAE_DTYPE") or VAE_AUTO)  # auto: bf16 on cuda, fp32 on cpu
    add_attention_flag(parser, default=_env("H3APP_ATTENTION") or "auto")  # docs/performance.md, "Attention"
    parser.add_argument("--mcp", action="store_true", default=os.environ.get("GRADIO_MCP_SERVER", "").lower() == "true",
                        help="also serve the tools to agents over MCP at /gradio_api/mcp/ (env GRADIO_MCP_SERVER=true)")
    return parser


def serving_of(args: argparse.Namespace):
    """What the flags and variables set (``hardware.auto.Serving``; None: left to the app)."""
    from h3app.hardware.auto import Serving

    return Serving(model=args.model, device=args.device, dtype=args.dtype, offload=args.offload, fp8=args.fp8,
                   fp8_text_encoder=args.fp8_text_encoder, ulysses=args.ulysses, ring=args.ring,
                   vae_dtype=args.vae_dtype)


def choose(args: argparse.Namespace, box=True):
    """Fill ``args`` with the app's choice for ``box`` (True: this machine's; a flavor or None stands in for it) and
    return the choice; its variables go to the environment, so that ranks started from this command line (which
    re-run it) serve the same."""
    from h3app.hardware.auto import choose as choose_for_box
    from h3app.hardware.preflight import this_box

    choice = choose_for_box(serving_of(args), this_box() if box is True else box)
    serving = choice.serving
    for name in ("model", "device", "dtype", "offload", "fp8", "fp8_text_encoder", "ulysses", "ring"):
        setattr(args, name, getattr(serving, name))
    os.environ.update(serving.environment())
    return choice


def serve() -> None:
    from h3app.backend import zero_gpu

    zero_gpu.import_spaces_first()  # on ZeroGPU `spaces` comes before anything that could initialise CUDA
    use_persistent_storage()
    args = build_parser().parse_args()

    from h3app.model.loader import LoadOptions, parse_dtype

    home = zero_gpu_home(args)  # None on a dedicated box or a CPU: as before
    with zero_gpu.outside_emulation():  # the judge's rehearsals run on h3app's fake CUDA, not spaces' emulation
        print(choose(args, box=home.box if home is not None else True).line, flush=True)  # what runs here and why
    if home is not None:
        print(home.line, flush=True)
    # A bad dtype, a missing GPU or (offline) an uncached model: refused before diffusers and Gradio load (~10 s
    # more on 2 cores) and before any rank starts.
    refuse_before_libraries(args)
    options = LoadOptions(dtype=parse_dtype(args.dtype), device=args.device, offload=args.offload, fp8=args.fp8,
                          fp8_text_encoder=args.fp8_text_encoder, token=os.environ.get("HF_TOKEN"),
                          compile=args.compile, vae_dtype=args.vae_dtype, attention=args.attention,
                          split=split_of(args))
    from h3app.model.attention import startup_line

    attention = startup_line(options)  # the backend the transformer will run (a named one that cannot: refused above)
    print(attention, flush=True)
    quiet_libraries()
    from h3app.hardware.preflight import check_before_download, held_limits
    from h3app.model.repo import pending_download
    from h3app.parallel.launch import close_ranks, start_ranks

    # the judge's verdict on this box (a real model that cannot fit: refused before downloading), and the longest
    # clip and largest canvas it holds there: the UI's and the API's limits
    with zero_gpu.outside_emulation():
        verdict = check_before_download(args.model, options, ranks=args.ulysses * args.ring, ring=args.ring,
                                        **(home.judged if home is not None else {}))
        held = held_limits(verdict, options)
    group = start_ranks(args)  # --ulysses/--ring: rank 0 serves, the others follow (docs/multi-gpu.md)
    leader = group is None or group.leader
    download = pending_download(args.model, revision=options.revision, token=options.token) if leader else None
    from h3app.backend.service import backend_from_env, hosted_from_env
    from h3app.hardware.estimate import for_app
    from h3app.hardware.summary import hardware_line
    from h3app.parallel.follower import bind, follow
    from h3app.ui.app_ui import build_app, launch_kwargs
    from h3app.ui.serving.startup_page import while_starting

    with while_starting(download, show_log=not hosted_from_env()):  # first-start download progress on the app's port
        backend = backend_from_env(args.model, options)
        if held is not None:
            backend.hold_to(max_seconds=held["max_duration_s"], max_pixels=held["max_pixels"])
        backend.time_model = zero_gpu.outside_emulation_of(
            home.time_model(args.model, options) if home is not None and home.box is not True
            else for_app(args.model, options, ranks=args.ulysses * args.ring, ring=args.ring))
        bind(group, backend)  # ranks > 1: every job in lockstep (docs/multi-gpu.md)
    try:
        if group is not None and not group.leader:
            sys.exit(follow(group, backend))
        build_app(backend, hardware=f"{hardware_line(args.model, options)} · {attention}", mcp=args.mcp).launch(
            **launch_kwargs(backend, mcp=args.mcp))
    finally:
        backend.close()
        close_ranks(group)


def zero_gpu_home(args: argparse.Namespace):
    """On ZeroGPU (``SPACES_ZERO_GPU``) or its stand-in (``H3APP_ZEROGPU_FORK=1``): the home (``hardware.zero_gpu_home``,
    the card each call is granted, judged instead of the emulated CUDA device), after refusing in one line what
    cannot run there (``--compile``, several ranks); None elsewhere."""
    from h3app.backend import zero_gpu

    mode = zero_gpu.mode()
    if mode is None:
        return None
    from h3app.hardware.zero_gpu_home import home_for

    if mode == zero_gpu.FORK and args.device is None:
        args.device = "cpu"  # the stand-in forks the process: CUDA cannot run in a forked child
    return home_for(mode, compile=args.compile, ranks=(args.ulysses or 1) * (args.ring or 1),
                    device=args.device)


if __name__ == "__main__":
    main()
