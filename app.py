"""H3 LoRA Lab — run the app: `python app.py [--model tiny|FOLDER|REPO_ID]`.

Host and port come from Gradio's own variables (GRADIO_SERVER_NAME, GRADIO_SERVER_PORT); the model from --model
or H3APP_MODEL (default: the embedded tiny checkpoint); hosted mode, adapter size cap and output folder from
H3APP_HOSTED, H3APP_MAX_ADAPTER_MB and H3APP_OUTPUT_DIR. README.md lists every variable.
"""

import argparse
import os

from h3app.cli import quiet_libraries


def use_persistent_storage() -> None:
    """On a Space with persistent storage (/data), keep the Hugging Face cache there: ~124 GB of weights are
    downloaded once, not on every restart."""
    if "HF_HOME" not in os.environ and os.path.isdir("/data") and os.access("/data", os.W_OK):
        os.environ["HF_HOME"] = "/data/.huggingface"


def main() -> None:
    use_persistent_storage()
    parser = argparse.ArgumentParser(description="H3 LoRA Lab web app")
    parser.add_argument("--model", default=os.environ.get("H3APP_MODEL", "tiny"))
    parser.add_argument("--dtype", default=os.environ.get("H3APP_DTYPE", "float32"))
    parser.add_argument("--device", default=os.environ.get("H3APP_DEVICE", "cpu"))
    parser.add_argument("--offload", default=os.environ.get("H3APP_OFFLOAD", "none"))
    args = parser.parse_args()
    quiet_libraries()

    from h3app.backend.service import backend_from_env
    from h3app.model.loader import LoadOptions, parse_dtype
    from h3app.ui.app_ui import build_app, launch_kwargs

    options = LoadOptions(dtype=parse_dtype(args.dtype), device=args.device, offload=args.offload,
                          token=os.environ.get("HF_TOKEN"))
    backend = backend_from_env(args.model, options)
    build_app(backend).launch(**launch_kwargs(backend))


if __name__ == "__main__":
    main()
