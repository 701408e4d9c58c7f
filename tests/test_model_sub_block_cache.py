"""Sub-block output caches: a prompt-cache hit skips the text encoder; a decode-cache hit skips the VAEs; neither changes output."""

import pytest

from h3app.backend.generation import run_generation
from h3app.model.sub_block_cache import SubBlockCache
from h3app.request import GenerationRequest


@pytest.mark.slow
def test_cache_hit_skips_the_encoder_and_is_bitwise_equal(tiny_model):
    pipe = tiny_model.pipeline("t2va")
    cache = tiny_model.prompt_cache
    calls = []
    handle = tiny_model.components["text_encoder"].model.register_forward_hook(lambda *a: calls.append(1))
    try:
        hits, misses = cache.hits, cache.misses
        first = run_generation(pipe, GenerationRequest(prompt="thunder over the sea", seed=4, steps=3))
        second = run_generation(pipe, GenerationRequest(prompt="thunder over the sea", seed=4, steps=3))
        other = run_generation(pipe, GenerationRequest(prompt="a different prompt", seed=4, steps=3))
    finally:
        handle.remove()
    assert len(calls) == 2  # each distinct prompt encoded once
    assert (cache.hits - hits, cache.misses - misses) == (1, 2)
    assert first.hash == second.hash != other.hash

    # bitwise equal to a pipeline that never saw the cache
    from diffusers import ModularPipeline

    plain = ModularPipeline.from_pretrained(str(tiny_model.location.folder), workflow="t2va")
    plain.update_components(**{name: tiny_model.components[name] for name in plain.pretrained_component_names
                               if name in tiny_model.components})
    plain.set_progress_bar_config(disable=True)
    uncached = run_generation(plain, GenerationRequest(prompt="thunder over the sea", seed=4, steps=3))
    assert uncached.hash == first.hash


def test_lru_evicts_oldest():
    cache = SubBlockCache(max_entries=2)
    for key in "abc":
        cache.put(key, {"x": key})
    assert cache.get("a") is None and cache.get("c") == {"x": "c"} and len(cache) == 2


@pytest.mark.slow
def test_decode_cache_only_inside_its_block_and_reuses_equal_latents(tiny_model):
    pipe = tiny_model.pipeline("t2va")
    request = GenerationRequest(prompt="decode once", seed=9, steps=2)
    decodes = []
    original_decode = tiny_model.components["vae"].decode

    def counting_decode(*args, **kwargs):
        decodes.append(1)
        return original_decode(*args, **kwargs)

    tiny_model.components["vae"].decode = counting_decode
    try:
        outside = [run_generation(pipe, request).hash for _ in range(2)]
        assert len(decodes) == 2 and len(tiny_model.decode_cache) == 0  # off by default
        decodes.clear()
        with tiny_model.decode_cache.enabled():
            inside = [run_generation(pipe, request).hash for _ in range(2)]
            other = run_generation(pipe, GenerationRequest(prompt="decode once", seed=10, steps=2)).hash
        assert len(decodes) == 2  # seed 9 decoded once, seed 10 once
        assert len(tiny_model.decode_cache) == 0  # emptied when the block ends
    finally:
        del tiny_model.components["vae"].decode
    assert outside == inside and other != inside[0]
