"""h3app.adapters.known: the registry of public H3 adapters, matched by repo + file name."""

from __future__ import annotations

import dataclasses

import pytest

from h3app.adapters.known import KNOWN_ADAPTERS, find_known, registry_identity, repo_from_cache_path

LIGHTX2V = "lightx2v/Minimax-h3-Turbo"
LARRY = "larryvrh/MiniMax-H3-Turbo-Lora"


@pytest.mark.parametrize(
    "repo, filename, expected",
    [
        (LIGHTX2V, "minimax_h3_fl2v_turbo_4step_v0.1.safetensors",
         dict(alpha=8.0, rank=128, steps=5, shift=12.0, audio_shift=3.0, workflow="fl2va")),
        (LIGHTX2V, "minimax_h3_ref2v_turbo_4step_v0.1_bf16.safetensors", dict(alpha=8.0, steps=5, workflow="ref2va")),
        (LIGHTX2V, "minimax_h3_turbo_8step_v1.0_bf16.safetensors", dict(alpha=None, steps=9, shift=12.0)),
        (LIGHTX2V, "minimax_h3_turbo_8step_v1.0_768p.safetensors", dict(alpha=None, steps=9, shift=6.0)),
        (LIGHTX2V, "minimax_h3_turbo_4step_v1.2_768p.safetensors", dict(alpha=None, steps=5, shift=6.0)),
        (LARRY, "minimax_h3_turbo_v4_step600_ema.safetensors", dict(alpha=None, alpha_equals_rank=True, steps=9)),
        (LARRY, "minimax_h3_turbo_4step_ema_ckpt850.safetensors", dict(alpha_equals_rank=True, steps=5)),
        (LARRY, "some_future_file.safetensors", dict(alpha_equals_rank=True, steps=None)),
        ("fal/MiniMax-H3-Realism-People-LoRA", "h3-realism-people-t2v-i2v-r2v.safetensors",
         dict(trigger="r34l1sm", scale=0.7, steps=50, alpha=None)),
    ],
)
def test_registry_entries(repo: str, filename: str, expected: dict) -> None:
    entry = find_known(repo, filename)
    assert entry is not None
    for field, value in expected.items():
        assert getattr(entry, field) == value, field
    assert entry.to_json()["source"] == "registry"


def test_matching_needs_repo_and_file() -> None:
    assert find_known(None, "minimax_h3_fl2v_turbo_4step_v0.1.safetensors") is None
    assert find_known("someone/else", "minimax_h3_fl2v_turbo_4step_v0.1.safetensors") is None
    assert find_known(LIGHTX2V.upper(), "sub/minimax_h3_fl2v_turbo_4step_v0.1.safetensors") is not None


def test_entries_are_frozen_and_steps_count_sigma_points() -> None:
    entry = KNOWN_ADAPTERS[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.alpha = 1.0  # type: ignore[misc]
    # "steps" is num_inference_steps: a 4-step distilled adapter has 5 sigma points, an 8-step one 9.
    for known in KNOWN_ADAPTERS:
        if known.steps is not None and "4-step" in known.title:
            assert known.steps == 5
        if known.steps is not None and ("8-step" in known.title or "8 evaluations" in known.title):
            assert known.steps == 9


def test_identity_from_urls_repo_ids_and_the_hub_cache(tmp_path) -> None:
    url = "https://huggingface.co/lightx2v/Minimax-h3-Turbo/resolve/b65e359c/minimax_h3_fl2v_turbo_4step_v0.1.safetensors"
    assert registry_identity(url, None, "x") == (LIGHTX2V, "minimax_h3_fl2v_turbo_4step_v0.1.safetensors")
    blob = "https://huggingface.co/larryvrh/MiniMax-H3-Turbo-Lora/blob/main/minimax_h3_turbo_4step.safetensors"
    assert registry_identity(blob, None, "x") == (LARRY, "minimax_h3_turbo_4step.safetensors")
    assert registry_identity(LARRY, "a.safetensors", "b.safetensors") == (LARRY, "a.safetensors")
    cached = f"/h/hub/models--lightx2v--Minimax-h3-Turbo/snapshots/{'a' * 40}/minimax_h3_fl2v_turbo_4step_v0.1.safetensors"
    assert repo_from_cache_path(cached) == (LIGHTX2V, "minimax_h3_fl2v_turbo_4step_v0.1.safetensors")
    local = tmp_path / "mine.safetensors"
    local.write_bytes(b"")
    assert registry_identity(str(local), None, "mine.safetensors") == (None, "mine.safetensors")
