"""AdapterCache: keys name the exact file, LRU eviction within a byte budget, shared tensors counted once."""

import threading

import torch
from lora_fixtures import make_adapter

from h3app.lora.cache import AdapterCache, AdapterKey, adapter_nbytes

SHAPES = {"transformer_blocks.0.attn.to_q": (32, 24), "transformer_blocks.0.attn.to_k": (32, 24),
          "transformer_blocks.0.attn.to_v": (32, 24)}


def _adapter(seed=0, shared=False):
    return make_adapter(SHAPES, list(SHAPES), rank=4, alpha=4.0, seed=seed, shared_qkv_down=shared)


def _key(name, sha="0" * 64, revision="main"):
    return AdapterKey(source=f"org/{name}", revision=revision, file="a.safetensors", size=123, sha256=sha)


def test_nbytes_counts_each_storage_once():
    one = 4 * 24 * 4 + 32 * 4 * 4  # A + B in fp32
    assert adapter_nbytes(_adapter()) == 3 * one
    assert adapter_nbytes(_adapter(shared=True)) == 3 * one - 2 * (4 * 24 * 4)  # one shared A


def test_lru_eviction_by_bytes():
    size = adapter_nbytes(_adapter())
    cache = AdapterCache(budget_bytes=2 * size + 10)
    a, b, c = _adapter(1), _adapter(2), _adapter(3)
    assert cache.put(_key("a"), a) and cache.put(_key("b"), b)
    assert cache.get(_key("a")) is a  # a is now most recently used
    assert cache.put(_key("c"), c)
    assert _key("b") not in cache and cache.keys() == [_key("a"), _key("c")]
    assert cache.nbytes == 2 * size
    assert (cache.hits, cache.misses) == (1, 0)
    assert cache.get(_key("b")) is None and cache.misses == 1


def test_key_distinguishes_revision_and_hash_and_oversize_is_not_held():
    size = adapter_nbytes(_adapter())
    cache = AdapterCache(budget_bytes=size)
    cache.put(_key("a", sha="1" * 64), _adapter(1))
    assert cache.get(_key("a", sha="2" * 64)) is None
    assert cache.get(_key("a", sha="1" * 64, revision="v2")) is None
    big = make_adapter({"proj_out": (512, 512)}, ["proj_out"], rank=64, alpha=1.0)
    assert cache.put(_key("big"), big) is False
    assert len(cache) == 1 and _key("big") not in cache


def test_get_or_load_loads_once_even_with_threads():
    cache = AdapterCache(budget_bytes=1 << 20)
    calls = []
    lock = threading.Lock()

    def load():
        with lock:
            calls.append(1)
        return _adapter(5)

    first = cache.get_or_load(_key("x"), load)
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get_or_load(_key("x"), load))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and all(r is first for r in results)
    assert torch.equal(first.modules["transformer_blocks.0.attn.to_q"].down, _adapter(5).modules["transformer_blocks.0.attn.to_q"].down)
    assert cache.pop(_key("x")) is first and cache.nbytes == 0
