"""Registry of public MiniMax-H3 adapters whose intended settings are known from their authors.

Values are *suggestions* (source ``registry``): anything the file itself says (``.alpha`` tensors, metadata,
``adapter_config.json``) wins over them. ``steps`` is always ``num_inference_steps``, the number of sigma points
*including* the terminal 0, so a "4-step" distilled adapter needs 5 and an "8-step" one needs 9 (N − 1 model
evaluations). Sources: the adapters' own model cards and READMEs (LightX2V, Larry, fal), the SGLang cookbook and
vllm-omni PR #7062.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any, TypedDict

from ..rules.alpha_source import AlphaSource
from ..rules.choices import FL2VA, REF2VA, T2VA, TINY_REPO_ID
from ..rules.request_defaults import TINY_PROMPT
from .source.files import file_sha256
from .source.names import is_url, looks_like_repo_id
from .source.refs import parse_hf_url

FASTH3_REPO = "FastVideo/FastVideo-FastH3-4-step-Preview-v1-LoRA"
PDD_REPO = "alibaba-pai/MiniMax-H3-Acc-LoRAs"
LIGHTX2V_REPO = "lightx2v/Minimax-h3-Turbo"
LARRY_REPO = "larryvrh/MiniMax-H3-Turbo-Lora"
FAL_REALISM_REPO = "fal/MiniMax-H3-Realism-People-LoRA"
TINY_DEMO_REPO = TINY_REPO_ID  # the embedded checkpoint's own repo id names its demo adapters in assets/adapters
TINY_DEMO_DIR = Path(__file__).resolve().parents[2] / "assets" / "adapters"


@dataclass(frozen=True)
class KnownAdapter:
    """One known adapter file (or family of files, ``file_pattern`` being a regex searched in the file name).

    ``alpha`` is the training alpha when the file does not carry it (None: read it from the file);
    ``alpha_equals_rank`` records an author's statement that alpha = rank (so no fallback warning is due).
    ``steps`` is ``num_inference_steps`` (sigma points); ``shift``/``audio_shift`` the flow shifts it was
    distilled for; ``scale`` the suggested strength; ``sigmas`` the sigma positions its authors list when they are
    not diffusers' own grid (a fact shown, not applied: diffusers' modular H3 pipeline builds its grid itself).
    """

    repo_id: str
    file_pattern: str
    title: str
    alpha: float | None = None
    alpha_equals_rank: bool = False
    rank: int | None = None
    steps: int | None = None
    shift: float | None = None
    audio_shift: float | None = None
    workflow: str | None = None
    resolution: str | None = None
    trigger: str | None = None
    scale: float | None = None
    notes: str = ""
    prompt: str | None = None  # a prompt its base understands, set by the UI's Apply preset (None: the prompt stays)
    sigmas: tuple[float, ...] | None = None

    def matches(self, repo_id: str, filename: str) -> bool:
        return repo_id.lower() == self.repo_id.lower() and re.search(self.file_pattern, filename) is not None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "source": str(AlphaSource.REGISTRY)}


def _lightx2v(file_pattern: str, variant: str, resolution: str, steps: int, shift: float, **more: Any) -> KnownAdapter:
    """One of LightX2V's Turbo files (titled by variant and resolution; audio shift 3 in every one)."""
    return KnownAdapter(LIGHTX2V_REPO, file_pattern, f"LightX2V H3 Turbo {variant} ({resolution})", steps=steps,
                        shift=shift, audio_shift=3.0, resolution=resolution, **more)


class _Training(TypedDict):
    """How a family of files was trained, shared by several entries (passed to ``KnownAdapter`` as keywords)."""

    alpha: float
    rank: int


class _Recipe(_Training):
    """Training plus the sampling settings, shared by several entries."""

    steps: int
    shift: float
    audio_shift: float
    scale: float


LIGHTX2V_V0_1: _Training = {"alpha": 8.0, "rank": 128}  # the v0.1 files: rank 128, trained at alpha 8
ALPHA_IN_FILE = "Alpha is read from the file's metadata."

PDD_RECIPE: _Recipe = {"alpha": 64.0, "rank": 64, "steps": 9, "shift": 12.0, "audio_shift": 3.0, "scale": 1.0}
PDD_NOTES = ("Rank-64 trunk (bare lora_down/lora_up, pdd_config lora_alpha 64) plus a bank of 32 output heads per "
             "modality, combined per evaluation; 8 evaluations (9 steps) at shifts 12 / 3, Euler, no CFG. Other step "
             "counts that leave the bank's grid are refused; do not stack with other distillations or a step cache.")

# First match wins: specific files before the catch-all of their repo.
KNOWN_ADAPTERS: tuple[KnownAdapter, ...] = (
    KnownAdapter(FASTH3_REPO, r"\.safetensors$", "FastVideo FastH3 4-step Preview v1", alpha_equals_rank=True,
                 rank=64, steps=5, shift=12.0, audio_shift=3.0, workflow=T2VA, scale=1.0,
                 sigmas=(0.999, 0.749, 0.5, 0.25, 0.0),
                 notes="W = W + B@A (no alpha: scale 1) plus exact fp32 deltas (.diff/.diff_b) on the boundary modules "
                       "and norms; 4 evaluations. FastVideo lists the sigma positions shown; h3app runs diffusers' "
                       "5-step grid at shifts 12 / 3. The VSA variants' gates need FastVideo's VSA backend (refused)."),
    KnownAdapter(PDD_REPO, r"Ref2VA", "alibaba-pai PDD Acc 8-step (Ref2VA)", workflow=REF2VA, notes=PDD_NOTES,
                 **PDD_RECIPE),
    KnownAdapter(PDD_REPO, r"\.safetensors$", "alibaba-pai PDD Acc 8-step (FL2VA)", notes=PDD_NOTES, **PDD_RECIPE),
    _lightx2v(r"fl2v.*4step_v0\.1", "FL2V 4-step v0.1", "544p", 5, 12.0, workflow=FL2VA, **LIGHTX2V_V0_1,
              notes="No alpha in the file; the reference script uses lora_alpha 8 (at alpha = rank it is 16× too "
                    "strong)."),
    _lightx2v(r"ref2v.*4step_v0\.1", "Ref2V 4-step v0.1", "544p", 5, 12.0, workflow=REF2VA, **LIGHTX2V_V0_1,
              notes="Declares alpha 8 in its metadata; the registry value only fills in for copies without it."),
    _lightx2v(r"4step_v0\.1", "4-step v0.1", "544p", 5, 12.0, **LIGHTX2V_V0_1),
    _lightx2v(r"8step.*768p", "8-step", "768p", 9, 6.0, notes=ALPHA_IN_FILE),
    _lightx2v(r"8step", "8-step", "544p", 9, 12.0, notes=ALPHA_IN_FILE),
    _lightx2v(r"4step_v1\.\d+.*768p", "4-step v1.x", "768p", 5, 6.0,
              notes="Alpha is read from the file's metadata (128 for v1.0/v1.1, 8 for v1.2)."),
    KnownAdapter(
        LARRY_REPO, r"v4_step\d+", "Larry H3 Turbo v4 (8 evaluations)",
        alpha_equals_rank=True, steps=9, scale=1.0,
        notes="Author states W_eff = W + B@A (alpha = rank); mixed ranks 64 (attention, FFN) and 16 (AdaLN).",
    ),
    KnownAdapter(
        LARRY_REPO, r"4step", "Larry H3 Turbo 4-step",
        alpha_equals_rank=True, rank=64, steps=5, scale=1.0,
        notes="Author states W_eff = W + B@A (alpha = rank).",
    ),
    KnownAdapter(
        LARRY_REPO, r"\.safetensors$", "Larry H3 Turbo",
        alpha_equals_rank=True,
        notes="Author states W_eff = W + B@A (alpha = rank); pick steps from the file name.",
    ),
    KnownAdapter(
        TINY_DEMO_REPO, r"^tiny_turbo_4step\.safetensors$", "Tiny H3 Turbo 4-step (demo)",
        alpha=1.0, rank=16, steps=5, shift=12.0, audio_shift=3.0, scale=1.0, prompt=TINY_PROMPT,
        notes="Trained at alpha = r/16 = 1 with the tiny model's own recipe; no alpha in the "
              "file, so the alpha = rank fallback (16) is 16× too strong, like LightX2V's rank 128 / alpha 8.",
    ),
    KnownAdapter(
        FAL_REALISM_REPO, r"\.safetensors$", "fal H3 Realism People",
        steps=50, trigger="r34l1sm", scale=0.7,
        notes="Keep the normal 50-step schedule; 0.6-0.8 for a lighter effect, 1.0 at full strength.",
    ),
)


def find_known(repo_id: str | None, filename: str | None) -> KnownAdapter | None:
    """The registry entry for ``filename`` in ``repo_id`` (matched on the file's base name), or None."""
    if not repo_id or not filename:
        return None
    base = PurePosixPath(filename).name
    for entry in KNOWN_ADAPTERS:
        if entry.matches(repo_id, base):
            return entry
    return None


_HUB_CACHE = re.compile(r"models--(?P<owner>[^/\\]+?)--(?P<name>[^/\\]+)[/\\]snapshots[/\\][0-9a-f]+[/\\](?P<file>.+)$")


def repo_from_cache_path(path: str) -> tuple[str, str] | None:
    """``(repo_id, filename)`` for a file inside the Hugging Face cache (``models--owner--name/snapshots/<sha>/f``)."""
    found = _HUB_CACHE.search(str(path))
    if not found:
        return None
    return f"{found['owner']}/{found['name']}", found["file"].replace("\\", "/")


def registry_identity(source: str, weight_name: str | None, file_name: str, *,
                      repo_id: str | None = None) -> tuple[str | None, str]:
    """``(repo_id, filename)`` to look ``source`` up in the registry — the one rule for every kind of source, used
    by inspection, by Load and by every job (so what Inspect shows is what runs):

    - a Hub file (``repo_id`` given: the parsed or fetched reference knows its repo) → that repo and ``file_name``;
    - an HF URL (the one URL parser, ``refs.parse_hf_url``) or a repo id → its repo and file;
    - a local file inside the Hugging Face cache → the cached repo and file;
    - a demo adapter in ``assets/adapters`` (by path, or picked in the UI) → the tiny checkpoint's repo;
    - any other local file, an upload included → ``(None, file_name)``: no registry entry can name it."""
    from ..errors import H3AppError

    if repo_id is not None:
        return repo_id, file_name
    if is_url(source):
        try:
            ref = parse_hf_url(source, weight_name or None, None)  # a folder URL needs the name to name a file
        except H3AppError:
            return None, weight_name or file_name
        return ref.repo_id, ref.filename or weight_name or file_name
    if looks_like_repo_id(source) and not Path(source).exists():
        return source, weight_name or file_name
    cached = repo_from_cache_path(source)
    if cached is not None:
        return cached
    path = Path(source)
    if path.is_dir():  # a local folder names its weight file by weight_name (or the one file it holds)
        path = path / (weight_name or file_name)
    relative: Path | str | None
    try:
        relative = path.resolve().relative_to(TINY_DEMO_DIR)
    except (OSError, ValueError):
        relative = None
    if relative is None:  # an upload or any other copy of a demo file is that demo adapter
        relative = demo_copy(path)
    if relative is not None:  # a demo adapter (a file, or a file inside a demo PEFT folder)
        return TINY_DEMO_REPO, PurePosixPath(relative).as_posix()
    return None, weight_name or file_name


def demo_copy(path: Path) -> str | None:
    """The demo adapter (its path inside ``assets/adapters``) whose bytes ``path`` holds, else None. Only a file of
    a demo file's exact size is hashed, so a real adapter costs one ``stat``."""
    try:
        stat = path.stat()
    except (OSError, ValueError):
        return None
    candidates = _demo_files().get(stat.st_size)
    if not candidates or not path.is_file():
        return None
    digest = file_sha256(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    return candidates.get(digest)


@lru_cache(maxsize=1)
def _demo_files() -> dict[int, dict[str, str]]:
    """size → {sha256 → path inside assets/adapters} of the shipped demo ``.safetensors`` files."""
    files: dict[int, dict[str, str]] = {}
    if TINY_DEMO_DIR.is_dir():
        for file in sorted(TINY_DEMO_DIR.rglob("*.safetensors")):
            stat = file.stat()
            files.setdefault(stat.st_size, {})[file_sha256(str(file), stat.st_size, stat.st_mtime_ns)] = (
                file.relative_to(TINY_DEMO_DIR).as_posix())
    return files

