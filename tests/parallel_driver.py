"""A program every rank runs (started as ``python tests/parallel_driver.py OUT.json --ulysses 2``): rank 0 drives
a Backend through the parallel scenarios and writes what it saw to OUT.json; the other ranks follow. Rank 1 carries
an injected fault: attaching an adapter at strength 0.5 fails there (after the real attach), and only there."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polling import wait_until  # noqa: E402  (tests/, this script's folder)

from h3app.backend.service import Backend  # noqa: E402
from h3app.errors import H3AppError  # noqa: E402
from h3app.lora.engine import LoRAEngine  # noqa: E402
from h3app.model.loader import LoadOptions  # noqa: E402
from h3app.parallel.diagnostics import weights_digests  # noqa: E402
from h3app.parallel.follower import bind, follow  # noqa: E402
from h3app.parallel.launch import close_ranks, start_ranks  # noqa: E402
from h3app.parallel.topology import add_parallel_arguments  # noqa: E402
from h3app.request import GenerationRequest  # noqa: E402
from h3app.settings import LoRASettings  # noqa: E402

ADAPTER = str(ROOT / "assets" / "adapters" / "lightx2v_turbo_no_alpha.safetensors")
OTHER_ADAPTER = str(ROOT / "assets" / "adapters" / "kohya_musubi.safetensors")  # a new attach, where the fault is
REQUEST = GenerationRequest(prompt="a lighthouse in a storm", seed=3, steps=2)
INJECT_STRENGTH = 0.5


class Injected(RuntimeError):
    """The fault injected on rank 1."""


def inject_on(rank: int) -> None:
    original = LoRAEngine.attach

    def attach(self, adapter, settings, name=None):  # type: ignore[no-untyped-def]
        report = original(self, adapter, settings, name)
        if settings.strength == INJECT_STRENGTH:
            raise Injected(f"injected fault on rank {rank}")
        return report

    LoRAEngine.attach = attach  # type: ignore[method-assign]


def lead(backend: Backend, out: dict) -> None:
    import numpy as np

    folder = Path(out["arrays"])
    out["digests_base"] = weights_digests(backend)
    for name, adapters in (("plain", ()), ("adapter", (LoRASettings(source=ADAPTER, strength=1.0),))):
        result = backend.generate(REQUEST, adapters).result
        np.savez(folder / f"{name}.npz", video=result.video, audio=result.audio)
        out[f"hash_{name}"] = result.hash
    out["digests_with_adapter"] = weights_digests(backend)  # the adapter stays attached between jobs
    try:
        backend.generate(REQUEST, (LoRASettings(source=OTHER_ADAPTER, strength=INJECT_STRENGTH),))
        out["injected_error"] = None
    except H3AppError as error:
        out["injected_error"] = [type(error).__name__, str(error)]
    out["outcomes_injected"] = backend.wrap_job.group.outcomes
    out["digests_after_failure"] = weights_digests(backend)  # the failure detached every adapter on every rank
    out["hash_after_failure"] = backend.generate(REQUEST, ()).result.hash

    handle = backend.submit_generate(GenerationRequest(prompt="a long one", seed=1, steps=8), ())
    wait_until(lambda: handle.progress.done >= 1 or handle.done, "the job's first step", wait=handle.wait_for_change,
               step=0.1)
    handle.cancel()
    try:
        backend.run(handle)
        out["cancel_error"] = None
    except H3AppError as error:
        out["cancel_error"] = [type(error).__name__, str(error)]
    out["outcomes_cancel"] = backend.wrap_job.group.outcomes
    out["hash_after_cancel"] = backend.generate(REQUEST, ()).result.hash

    victim = backend.wrap_job.group.spawned[0].process
    victim.kill()
    victim.wait()
    started = time.monotonic()
    errors = []
    for _ in range(2):  # the first job finds the rank gone; the next is refused at once
        try:
            backend.generate(REQUEST, ())
            errors.append(None)
        except H3AppError as error:
            errors.append([type(error).__name__, str(error)])
    out["dead_rank_errors"] = errors
    out["dead_rank_seconds"] = time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    add_parallel_arguments(parser)
    args = parser.parse_args()
    args.device = "cpu"
    group = start_ranks(args)
    assert group is not None, "run with --ulysses 2"
    if group.rank == 1:
        inject_on(group.rank)
    output_dir = Path(tempfile.mkdtemp(prefix="h3app-parallel-test-"))
    backend = Backend("tiny", LoadOptions(), output_dir=output_dir)
    bind(group, backend)
    try:
        if not group.leader:
            return follow(group, backend)
        out: dict = {"arrays": str(Path(args.out).parent)}
        lead(backend, out)
        Path(args.out).write_text(json.dumps(out, indent=1))
    finally:
        backend.close()
        close_ranks(group)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
