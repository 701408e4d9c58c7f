"""H3 LoRA Lab — run the app: `python app.py [--model tiny|FOLDER|REPO_ID] [--ulysses N] [--compile] [--mcp]`.

Host and port come from Gradio's own variables (GRADIO_SERVER_NAME, GRADIO_SERVER_PORT); the model from --model
or H3APP_MODEL (default: the embedded tiny checkpoint); hosted mode, adapter size cap and output folder from
H3APP_HOSTED, H3APP_MAX_ADAPTER_MB and H3APP_OUTPUT_DIR. README.md lists every variable.
"""

import argparse
import os
import sys

from h3app.cli import quiet_libraries
from h3app.commands.model_options import add_compile_flag, add_fp8_flags
from h3app.errors import H3AppError
from h3app.parallel.topology import add_parallel_arguments


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


def build_parser() -> argparse.ArgumentParser:
    """The app's flags (each defaults from its environment variable)."""
    parser = argparse.ArgumentParser(description="H3 LoRA Lab web app")
    parser.add_argument("--model", default=os.environ.get("H3APP_MODEL", "tiny"))
    parser.add_argument("--dtype", default=os.environ.get("H3APP_DTYPE", "float32"))
    parser.add_argument("--device", default=os.environ.get("H3APP_DEVICE", "cpu"))
    parser.add_argument("--offload", default=os.environ.get("H3APP_OFFLOAD", "none"))
    add_fp8_flags(parser)  # --fp8, --fp8-text-encoder (H3APP_FP8, H3APP_FP8_TEXT_ENCODER)
    add_parallel_arguments(parser)
    add_compile_flag(parser)
    parser.add_argument("--mcp", action="store_true", default=os.environ.get("GRADIO_MCP_SERVER", "").lower() == "true",
                        help="also serve the tools to agents over MCP at /gradio_api/mcp/ (env GRADIO_MCP_SERVER=true)")
    return parser


def serve() -> None:
    use_persistent_storage()
    args = build_parser().parse_args()
    quiet_libraries()

    from h3app.backend.service import backend_from_env, hosted_from_env
    from h3app.hardware.preflight import check_before_download
    from h3app.hardware.summary import hardware_line
    from h3app.model.loader import LoadOptions, parse_dtype
    from h3app.model.repo import pending_download
    from h3app.parallel.follower import bind, follow
    from h3app.parallel.launch import close_ranks, start_ranks
    from h3app.ui.app_ui import build_app, launch_kwargs
    from h3app.ui.startup_page import while_starting

    options = LoadOptions(dtype=parse_dtype(args.dtype), device=args.device, offload=args.offload, fp8=args.fp8,
                          fp8_text_encoder=args.fp8_text_encoder, token=os.environ.get("HF_TOKEN"),
                          compile=args.compile)  # a bad dtype or a missing GPU: refused before any rank starts
    check_before_download(args.model, options)  # a real model that cannot fit this GPU: refused before downloading
    group = start_ranks(args)  # --ulysses/--ring: rank 0 serves, the others follow (docs/multi-gpu.md)
    leader = group is None or group.leader
    download = pending_download(args.model, revision=options.revision, token=options.token) if leader else None
    with while_starting(download, show_log=not hosted_from_env()):  # first-start download progress on the app's port
        backend = backend_from_env(args.model, options)
        bind(group, backend)  # ranks > 1: every job in lockstep (docs/multi-gpu.md)
    try:
        if group is not None and not group.leader:
            sys.exit(follow(group, backend))
        build_app(backend, hardware=hardware_line(args.model, options), mcp=args.mcp).launch(
            **launch_kwargs(backend, mcp=args.mcp))
    finally:
        backend.close()
        close_ranks(group)


if __name__ == "__main__":
    main()
