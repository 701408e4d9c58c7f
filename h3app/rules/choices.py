"""Fixed choices, one constant per fact. Validation messages list these, so a new choice is added here only."""

# The embedded tiny checkpoint's repo id (assets/tiny-h3): its index names it, and it names the demo adapters.
TINY_REPO_ID = "h3app/tiny-h3"
REAL_REPO_ID = "MiniMaxAI/MiniMax-H3"  # the full-size model on the Hub
T2VA, FL2VA, REF2VA = "t2va", "fl2va", "ref2va"  # text / first-last frame / reference → video + audio
WORKFLOWS = (T2VA, FL2VA, REF2VA)
MAIN_PARTITION = "transformer"  # the transformer t2va and fl2va run
REFERENCE_PARTITION = "transformer_ref"  # the one ref2va runs
PARTITIONS = (MAIN_PARTITION, REFERENCE_PARTITION)
REFERENCE_WORKFLOW = REF2VA


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
# --vae-dtype: what the video decoder computes in (the audio decoder stays fp32); default fp32, diffusers' pin
VAE_DTYPES = ("float32", "bfloat16")
# Step-preview decoders (h3app.model.preview_decoders): auto picks; the model's own VAE when it is small; fitted
# latent→RGB factors; false colours from the latents' principal directions.
PREVIEW_VAE, PREVIEW_LATENT2RGB, PREVIEW_PCA = "vae", "latent2rgb", "pca"
PREVIEW_DECODERS = ("auto", PREVIEW_VAE, PREVIEW_LATENT2RGB, PREVIEW_PCA)
