"""Fixed choices, one constant per fact. Validation messages list these, so a new choice is added here only."""

from ..errors import H3AppError

# The embedded tiny checkpoint's repo id (assets/tiny-h3): its index names it, and it names the demo adapters.
TINY_REPO_ID = "h3app/tiny-h3"
REAL_REPO_ID = "MiniMaxAI/MiniMax-H3"  # the full-size model on the Hub
T2VA, FL2VA, REF2VA = "t2va", "fl2va", "ref2va"  # text / first-last frame / reference → video + audio
WORKFLOWS = (T2VA, FL2VA, REF2VA)
MAIN_PARTITION = "transformer"  # the transformer t2va and fl2va run
REFERENCE_PARTITION = "transformer_ref"  # the one ref2va runs
PARTITIONS = (MAIN_PARTITION, REFERENCE_PARTITION)
REFERENCE_WORKFLOW = REF2VA


def check_workflow(workflow: str) -> str:
    """``workflow`` if it names one, else one line naming the choices."""
    if workflow not in WORKFLOWS:
        raise H3AppError(f"unknown workflow {workflow!r}: use one of {', '.join(WORKFLOWS)}.")
    return workflow


def workflow_partition(workflow: str) -> str:
    """The transformer partition a (valid) workflow runs on: ``transformer_ref`` for ref2va, else ``transformer``."""
    return REFERENCE_PARTITION if workflow == REFERENCE_WORKFLOW else MAIN_PARTITION


# check --mode: one transformer forward on a seeded input (a check mode, not a partition), or the whole pipeline
TRANSFORMER_CHECK, FULL_CHECK = "transformer", "full"
CHECK_MODES = (TRANSFORMER_CHECK, FULL_CHECK)
UNMERGED, MERGED = "unmerged", "merged"
LORA_MODES = (UNMERGED, MERGED)
QKV_LAYOUTS = ("auto", "blocked", "interleaved")
OFFLOAD_MODES = ("none", "auto", "group")
# dtype names accepted on the command line and in the UI → torch dtype attribute names
DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}
# --cache: the denoising loop's step cache (model/denoise_cache.py): none, or diffusers' first-block cache
NO_CACHE, FIRST_BLOCK_CACHE = "none", "fbc"
STEP_CACHES = (NO_CACHE, FIRST_BLOCK_CACHE)


def check_cache(kind: str) -> str:
    """``kind`` if it names a step cache, else one line naming the choices."""
    if kind not in STEP_CACHES:
        raise H3AppError(f"--cache must be one of {', '.join(STEP_CACHES)}, got {kind!r}.")
    return kind


# --vae-dtype: what the video decoder computes in (the audio decoder stays fp32). auto, the default: bfloat16 on a
# CUDA GPU (as sglang and vLLM-Omni decode; the bound it keeps: docs/performance.md), float32 elsewhere (diffusers'
# pin: the CPU's frames and hashes are unchanged). vae_dtype_for resolves it for the loader, the plan and the app.
VAE_AUTO = "auto"
VAE_DTYPES = (VAE_AUTO, "float32", "bfloat16")
VAE_GPU_DTYPE, VAE_CPU_DTYPE = "bfloat16", "float32"  # what auto gives on a CUDA device / anywhere else


def vae_dtype_for(asked: str, device: str) -> str:
    """The dtype the video decoder computes in for ``--vae-dtype asked`` on ``device`` (``cpu``, ``cuda:1`` …), as
    torch's attribute name: ``auto`` → ``bfloat16`` on a CUDA device, else ``float32``; a named dtype (or its alias,
    :data:`DTYPE_NAMES`) as named. The one resolution of ``auto`` (loader, plan, start-up check, printed flags)."""
    if asked == VAE_AUTO:
        return VAE_GPU_DTYPE if str(device).startswith("cuda") else VAE_CPU_DTYPE
    name = DTYPE_NAMES.get(str(asked).strip().lower())
    if name is None:
        raise H3AppError(f"--vae-dtype must be one of {', '.join(VAE_DTYPES)}, got {asked!r}.")
    return name
# Step-preview decoders (h3app.model.preview_decoders): auto picks; the model's own VAE when it is small; fitted
# latent→RGB factors; false colours from the latents' principal directions.
PREVIEW_VAE, PREVIEW_LATENT2RGB, PREVIEW_PCA = "vae", "latent2rgb", "pca"
PREVIEW_DECODERS = ("auto", PREVIEW_VAE, PREVIEW_LATENT2RGB, PREVIEW_PCA)
