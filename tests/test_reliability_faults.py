"""Reliability: faults half-way through — cancel, an exception injected mid-attach / mid-merge / mid-re-merge, an
interrupted download, CUDA out-of-memory (simulated) — each ends at the bitwise base (or the exact previous state),
with one clear line where the user caused it, and the next job gives the same hash as on a fresh server.

Injection: a method of ``h3app.lora.layers`` is monkeypatched to raise on its N-th call, N chosen half-way through
the layers the adapter touches (counted by a dry run), so some layers have changed when it fires.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from bad_inputs import good_tensors
from hub_server import FakeHub, set_offline
from lora_fixtures import block_targets, build_tiny, linear_shapes, make_adapter, state_hash
from model_state import assert_at_base, close_server, open_server
from polling import wait_until

from h3app.backend.generation import Cancelled
from h3app.backend.service import Backend
from h3app.errors import H3AppError
from h3app.lora import layers
from h3app.lora.engine import LoRAEngine
from h3app.lora.layers import LoRALinear
from h3app.request import GenerationRequest
from h3app.settings import LoRASettings

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = ROOT / "assets" / "adapters"
TURBO = str(ADAPTERS / "lightx2v_turbo_no_alpha.safetensors")  # 12 targets: q/k/v/out/ff of both blocks
KOHYA = str(ADAPTERS / "kohya_musubi.safetensors")
REQUEST = GenerationRequest(prompt="a lighthouse in a storm", seed=11, steps=2)


class Injected(RuntimeError):
    """The fault a test injects (a bug or a device error in the middle of a change)."""


def fail_on_call(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, call_number: int,
                 error: Callable[[], BaseException] = lambda: Injected("injected fault")) -> dict[str, int]:
    """Make ``owner.name`` raise ``error()`` on its ``call_number``-th call (1-based) and behave normally otherwise."""
    original = getattr(owner, name)
    calls = {"count": 0}

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls["count"] += 1
        if calls["count"] == call_number:
            raise error()
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return calls


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    state = open_server(tiny_model, tmp_path_factory.mktemp("fault_outputs"))
    backend = state["backend"]
    reference = {
        "clean": backend.generate(REQUEST).result.hash,
        "turbo": backend.generate(REQUEST, [LoRASettings(source=TURBO, alpha=8.0)]).result.hash,
        "kohya": backend.generate(REQUEST, [LoRASettings(source=KOHYA, strength=0.5)]).result.hash,
    }
    backend.binder.reset()
    state["reference"] = reference
    yield state
    close_server(state)


def assert_next_job_is_clean(server: dict[str, Any]) -> None:
    """The server serves on, and its results are those of a fresh server (no leftover from the fault)."""
    backend: Backend = server["backend"]
    kohya = backend.generate(REQUEST, [LoRASettings(source=KOHYA, strength=0.5)]).result.hash
    assert kohya == server["reference"]["kohya"]
    assert backend.generate(REQUEST).result.hash == server["reference"]["clean"]
    assert_at_base(server)


# ------------------------------------------------------------------------------------------------------ cancel
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["unmerged", "merged"])
def test_cancel_mid_run_leaves_the_base_and_the_next_job_clean(mode: str, at_base: dict[str, Any]) -> None:
    backend: Backend = at_base["backend"]
    long_request = GenerationRequest(prompt="a lighthouse in a storm", seed=11, steps=8)
    handle = backend.submit_generate(long_request, [LoRASettings(source=TURBO, alpha=32.0, mode=mode)])
    wait_until(lambda: handle.progress.done >= 2 or handle.done, "two steps of the job", wait=handle.wait_for_change)
    assert not handle.done, "the job finished before it could be cancelled"
    handle.cancel()
    with pytest.raises(Cancelled, match=r"cancelled after \d+ of 7 steps"):
        handle.result(timeout=300)
    assert_at_base(at_base)
    assert_next_job_is_clean(at_base)


def test_cancel_while_queued_never_starts_the_job(at_base: dict[str, Any]) -> None:
    import threading

    backend: Backend = at_base["backend"]
    release = threading.Event()
    blocker = backend.worker.submit(lambda ctx: release.wait(30), label="blocker")
    try:
        wait_until(lambda: blocker.progress.phase == "running", "the blocker to run", wait=blocker.wait_for_change)
        queued = backend.submit_generate(REQUEST, [LoRASettings(source=TURBO, mode="merged")])
        assert queued.progress.phase == "queued" and queued.progress.position == 1
        queued.cancel()
    finally:
        release.set()
    blocker.result(timeout=30)
    with pytest.raises(Cancelled, match="before it started"):
        queued.result(timeout=30)
    assert_at_base(at_base)


# -------------------------------------------------------------------------------------------- injected faults
def _touched_layers(backend: Backend, settings: LoRASettings) -> int:
    """How many Linear layers ``settings``' adapter binds to (a dry run: nothing is attached)."""
    loaded = backend.binder.load(settings)
    return len({match.module for match in backend.binder.dry_run(loaded).matched})


@pytest.mark.parametrize("mode, owner, method", [
    ("unmerged", LoRALinear, "add_entry"),
    ("merged", LoRALinear, "add_entry"),
    ("merged", layers.PristineStore, "put"),
    ("merged", LoRALinear, "merge_from"),
    ("merged", layers.LoRAFactors, "add_to_weight"),
])
def test_an_exception_half_way_through_attach_rolls_back_to_the_bitwise_base(
        mode: str, owner: Any, method: str, at_base: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    backend: Backend = at_base["backend"]
    settings = LoRASettings(source=TURBO, alpha=8.0, mode=mode)
    layers_touched = _touched_layers(backend, settings)
    assert layers_touched >= 4
    calls = fail_on_call(monkeypatch, owner, method, call_number=layers_touched // 2 + 1)
    with pytest.raises(Injected):
        backend.generate(REQUEST, [settings])
    assert calls["count"] == layers_touched // 2 + 1  # it fired half-way, after some layers had changed
    monkeypatch.undo()
    assert_at_base(at_base)
    assert_next_job_is_clean(at_base)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["merge_from", "restore_from"])
def test_an_exception_half_way_through_a_re_merge_rolls_back(method: str, at_base: dict[str, Any],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Merged mode, adapter attached; the next job changes its alpha (re-merge from pristine) or drops it (restore),
    and the fault fires half-way: the backend resets to base; the engine alone restores the exact previous state."""
    backend: Backend = at_base["backend"]
    first = LoRASettings(source=TURBO, alpha=8.0, mode="merged")
    backend.generate(REQUEST, [first])
    layers_touched = _touched_layers(backend, first)
    change = [LoRASettings(source=TURBO, alpha=64.0, mode="merged")] if method == "merge_from" else []
    fail_on_call(monkeypatch, LoRALinear, method, call_number=layers_touched // 2 + 1)
    with pytest.raises(Injected):
        backend.generate(REQUEST, change)
    monkeypatch.undo()
    assert_at_base(at_base)
    assert_next_job_is_clean(at_base)


@pytest.mark.parametrize("mode", ["unmerged", "merged"])
def test_engine_rollback_restores_the_exact_previous_state_not_just_the_base(
        mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the engine alone (no backend reset): adapter A attached; attaching B fails half-way; A's state is bitwise
    what it was (weights, module tree and outputs)."""
    model = build_tiny(3)
    shapes = linear_shapes(model)
    targets = block_targets(shapes)
    engine = LoRAEngine(model)
    first = make_adapter(shapes, targets, rank=4, alpha=8.0, seed=1)
    second = make_adapter(shapes, targets, rank=2, alpha=2.0, seed=2)
    engine.attach(first, LoRASettings(source="a", mode=mode), "a")
    before = state_hash(model)
    wrappers = [name for name, m in model.named_modules() if isinstance(m, LoRALinear)]
    method = "merge_from" if mode == "merged" else "add_entry"
    owner = LoRALinear
    fail_on_call(monkeypatch, owner, method, call_number=len(targets) // 2 + 1)
    with pytest.raises(Injected):
        engine.attach(second, LoRASettings(source="b", mode=mode), "b")
    monkeypatch.undo()
    assert state_hash(model) == before
    assert [name for name, m in model.named_modules() if isinstance(m, LoRALinear)] == wrappers
    assert list(engine.active()) == ["a"]
    engine.detach()
    assert state_hash(model) == state_hash(build_tiny(3))


# ------------------------------------------------------------------------------------------ interrupted download
@pytest.fixture
def lora_repo(tmp_path: Path) -> Path:
    from safetensors.torch import save_file

    folder = tmp_path / "repo"
    folder.mkdir()
    # Big enough that a cut half-way is a real partial file (a few hundred kB).
    tensors = dict(good_tensors())
    tensors["blocks.1.adaln_proj.linear.lora_A.weight"] = torch.randn(256, 16) * 0.01
    tensors["blocks.1.adaln_proj.linear.lora_B.weight"] = torch.randn(432, 256) * 0.01
    save_file(tensors, str(folder / "lora.safetensors"))
    return folder


def test_an_interrupted_download_leaves_no_half_file_that_is_later_trusted(
        fake_hub: FakeHub, lora_repo: Path, tmp_path: Path, at_base: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    backend: Backend = at_base["backend"]
    fake_hub.add_repo("someone/lora", lora_repo)
    settings = LoRASettings(source="someone/lora", weight_name="lora.safetensors", alpha=8.0)
    fake_hub.interrupt_download("lora.safetensors", then="fail")
    with pytest.raises(H3AppError, match=r"someone/lora/lora\.safetensors.*nothing partial was kept") as caught:
        backend.generate(REQUEST, [settings])
    assert "\n" not in str(caught.value)
    assert any(r.interrupted for r in fake_hub.requests_for("someone/lora", "lora.safetensors"))
    assert_at_base(at_base)
    hf_home = tmp_path / "hf_home"
    assert list(hf_home.rglob("*.incomplete")) == []
    assert [p for p in hf_home.rglob("lora.safetensors")] == []  # no snapshot entry points at a half file

    set_offline(monkeypatch, True)  # offline, the half file must not be found and trusted
    with pytest.raises(H3AppError, match="not in the local cache and HF_HUB_OFFLINE=1"):
        backend.load(settings)
    set_offline(monkeypatch, False)
    fake_hub.clear_interruptions()
    result = backend.load(settings)
    expected = hashlib.sha256((lora_repo / "lora.safetensors").read_bytes()).hexdigest()
    assert result.provenance["sha256"] == expected
    backend.binder.reset()
    assert_at_base(at_base)


# ----------------------------------------------------------------------------------------------- out of memory
def _out_of_memory() -> BaseException:
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (simulated)")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["unmerged", "merged"])
def test_out_of_memory_in_the_denoiser_is_one_line_with_advice_and_the_next_job_is_clean(
        mode: str, at_base: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    backend: Backend = at_base["backend"]
    transformer = at_base["transformer"]
    fail_on_call(monkeypatch, transformer, "forward", call_number=1, error=_out_of_memory)
    with pytest.raises(H3AppError) as caught:
        backend.generate(REQUEST, [LoRASettings(source=TURBO, alpha=8.0, mode=mode)])
    message = str(caught.value)
    assert "\n" not in message and "out of GPU memory" in message
    assert "smaller" in message and "offload" in message  # advice: what to change
    monkeypatch.undo()
    assert_at_base(at_base)
    assert_next_job_is_clean(at_base)


def test_out_of_memory_while_merging_an_adapter_is_one_line_with_advice(
        at_base: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    backend: Backend = at_base["backend"]
    fail_on_call(monkeypatch, LoRALinear, "merge_from", call_number=2, error=_out_of_memory)
    try:
        with pytest.raises(H3AppError, match="out of GPU memory"):
            backend.generate(REQUEST, [LoRASettings(source=TURBO, alpha=8.0, mode="merged")])
    finally:
        monkeypatch.undo()
        assert_at_base(at_base)  # the rollback itself works today
