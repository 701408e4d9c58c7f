"""The committed tiny H3 is trained: it paints scenes, follows colour and pitch words, and its Turbo LoRA shows
what alpha does (alpha r/16 reproduces 50 steps in 4 evaluations; the alpha = rank fallback is 16× too strong)."""

from pathlib import Path

import numpy as np
import pytest
from test_demo_decoders import spectral_centroid

from h3app.adapters.known import find_known, registry_identity
from h3app.model.tiny_training.recipe import STYLE_FILE, TURBO_ALPHA, TURBO_FILE, TURBO_RANK, turbo_pairs
from h3app.request import GenerationRequest
from h3app.settings import LoRASettings

ADAPTERS = Path(__file__).resolve().parents[1] / "assets" / "adapters"
TURBO = str(ADAPTERS / TURBO_FILE)
STYLE = str(ADAPTERS / STYLE_FILE)
RED_LOW = "a red ball moving right over a grey floor, low loud hum"
BLUE_HIGH = "a blue ball moving left over a sand floor, high loud hum"
TURBO_PROMPT = "a yellow ball moving down over a grey floor, high soft hum"
TURBO_SEED = 7  # the Turbo LoRA was distilled on seeds 1000 and up: this one is held out


@pytest.fixture(scope="module")
def fifty_step(backend):
    """50-step results for the two contrasting prompts (``[F, H, W, 3]`` video, ``[2, S]`` audio)."""
    return {prompt: backend.generate(GenerationRequest(prompt=prompt, seed=seed, steps=50)).result
            for prompt, seed in ((RED_LOW, 0), (BLUE_HIGH, 1))}


def centre(video: np.ndarray, frames: int = 24) -> np.ndarray:
    """Mean RGB of the middle third (height and width) of the first ``frames`` frames."""
    _, height, width, _ = video.shape
    return video[:frames, height // 3 : 2 * height // 3, width // 3 : 2 * width // 3].reshape(-1, 3).mean(axis=0)


def neighbour_difference(video: np.ndarray) -> float:
    return float(np.mean([np.abs(np.diff(video, axis=1)).mean(), np.abs(np.diff(video, axis=2)).mean()]))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(1.0 / max(np.mean((a - b) ** 2), 1e-12)))


@pytest.mark.slow
def test_frames_are_pictures_not_noise(fifty_step):
    for result in fifty_step.values():
        video = result.video
        spread = float(video.std())
        assert spread > 0.05, "a flat picture is not a scene either"
        # i.i.d. noise has a neighbour difference of about 1.13 × its spread
        assert neighbour_difference(video) < 0.35 * spread


def test_colour_words_colour_the_ball(fifty_step):
    red, green, blue = centre(fifty_step[RED_LOW].video)
    assert red > blue + 0.2 and red > green + 0.2, (red, green, blue)
    red, green, blue = centre(fifty_step[BLUE_HIGH].video)
    assert blue > red + 0.2, (red, green, blue)


def test_low_and_high_words_order_the_spectral_centroids(fifty_step):
    low = spectral_centroid(fifty_step[RED_LOW].audio, fifty_step[RED_LOW].sample_rate)
    high = spectral_centroid(fifty_step[BLUE_HIGH].audio, fifty_step[BLUE_HIGH].sample_rate)
    assert 1.5 * low < high, (low, high)


@pytest.mark.slow
def test_turbo_lora_at_alpha_r_over_16_reproduces_fifty_steps_and_the_fallback_breaks(backend):
    request = GenerationRequest(prompt=TURBO_PROMPT, seed=TURBO_SEED, steps=50)
    assert (TURBO_PROMPT, TURBO_SEED) not in turbo_pairs(64)
    reference = backend.generate(request).result.video
    five = GenerationRequest(prompt=TURBO_PROMPT, seed=TURBO_SEED, steps=5)
    plain = psnr(backend.generate(five).result.video, reference)
    turbo = backend.generate(five, [LoRASettings(source=TURBO, alpha=TURBO_ALPHA)])
    assert turbo.result.evaluations == 4
    intended = psnr(turbo.result.video, reference)
    fallback = psnr(backend.generate(five, [LoRASettings(source=TURBO, alpha=float(TURBO_RANK))]).result.video,
                    reference)
    assert intended > plain, (intended, plain)
    assert fallback < plain - 1.0 and fallback < intended - 3.0, (fallback, plain, intended)


def test_turbo_file_has_no_alpha_and_the_registry_knows_it(backend):
    info = backend.inspect(TURBO)
    assert info.rank == TURBO_RANK
    assert info.alpha == TURBO_ALPHA and info.alpha_source == "registry"
    repo_id, filename = registry_identity(TURBO, None, Path(TURBO).name)
    known = find_known(repo_id, filename)
    assert known is not None and known.alpha == TURBO_ALPHA == TURBO_RANK / 16 and known.steps == 5


@pytest.mark.slow
def test_style_lora_warms_the_picture_and_alpha_moves_it(backend):
    request = GenerationRequest(prompt=BLUE_HIGH, seed=2, steps=9)
    base = backend.generate(request).result.video.reshape(-1, 3).mean(axis=0)
    half = backend.generate(request, [LoRASettings(source=STYLE, alpha=1.0)]).result.video.reshape(-1, 3).mean(axis=0)
    full = backend.generate(request, [LoRASettings(source=STYLE)]).result.video.reshape(-1, 3).mean(axis=0)
    warmth = [float(rgb[0] - rgb[2]) for rgb in (base, half, full)]
    assert warmth[0] < warmth[1] < warmth[2], warmth
    assert warmth[2] - warmth[0] > 0.15, warmth
