"""A program every rank runs (``python tests/modality_ranks_driver.py OUT.npz --ulysses 2``): the tiny transformer
sharded over the ranks (h3app's context parallel), an adapter on every block, AdaLN and input/output Linear with
per-modality factors, one forward on a packed sequence of even and one of odd length (ranks then hold unequal
shares); rank 0 writes the outputs to OUT.npz. ``tests/test_modality_ranks.py`` compares them with one process."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from lora_fixtures import build_tiny, linear_shapes, make_adapter  # noqa: E402

from h3app.lora.engine import LoRAEngine  # noqa: E402
from h3app.parallel.context_parallel import parallelize  # noqa: E402
from h3app.parallel.launch import close_ranks, start_ranks  # noqa: E402
from h3app.parallel.topology import add_parallel_arguments  # noqa: E402
from h3app.settings import LoRASettings  # noqa: E402

SETTINGS = LoRASettings(source="ranks", video_strength=0.6, text_strength=1.4, audio_strength=0.0,
                        block_strength="1:2")
LENGTHS = {"even": (4, 3, (2, 2, 2)), "odd": (3, 3, (2, 2, 2))}  # text rows, audio steps, video grid: 18 and 17 rows


def model_and_adapter() -> tuple[torch.nn.Module, object]:
    model = build_tiny(seed=3)
    shapes = linear_shapes(model)
    targets = [t for t in shapes if not t.startswith("time_embedder.")]
    return model, make_adapter(shapes, targets, rank=4, alpha=4, seed=11)


def inputs(name: str) -> dict[str, torch.Tensor]:
    from bench.models import packed_input

    text, audio, grid = LENGTHS[name]
    return packed_input(dict(build_tiny().config), video_grid=grid, audio_steps=audio, text_rows=text, seed=5)


def outputs(model: torch.nn.Module) -> dict[str, np.ndarray]:
    found = {}
    for name in LENGTHS:
        with torch.no_grad():
            out = model(**inputs(name), return_dict=True)
        found[f"{name}_video"], found[f"{name}_audio"] = out.sample.numpy(), out.audio_sample.numpy()
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    add_parallel_arguments(parser)
    args = parser.parse_args()
    args.device = "cpu"
    group = start_ranks(args)
    assert group is not None, "run with --ulysses 2"
    try:
        model, adapter = model_and_adapter()
        parallelize(model, group.spec)
        engine = LoRAEngine(model)
        engine.attach(adapter, SETTINGS, "a")
        found = outputs(model)
        engine.set_lora("a", advanced=LoRASettings(source="ranks"))
        found.update({f"plain_{key}": value for key, value in outputs(model).items()})
        if group.leader:
            np.savez(args.out, **found)
    finally:
        close_ranks(group)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
