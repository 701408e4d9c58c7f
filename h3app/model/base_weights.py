"""A few of a transformer's weights, read by name from its safetensors files without loading the model (what
``export`` needs to turn a DoRA into a plain LoRA at a fixed strength: the base weights its row norms read)."""

from __future__ import annotations

import json
from collections.abc import Iterable

import torch

from ..errors import H3AppError
from ..rules.choices import MAIN_PARTITION, REFERENCE_PARTITION, REFERENCE_WORKFLOW, T2VA
from .repo import locate

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
INDEX_NAME = WEIGHTS_NAME + ".index.json"


def read_base_weights(model: str, names: Iterable[str], partition: str = MAIN_PARTITION,
                      revision: str | None = None, token: str | None = None) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` for parameter ``names`` of ``model``'s ``partition`` transformer (``tiny``, a local folder
    or a Hub repo id, as ``--model``), read one tensor at a time."""
    from safetensors import safe_open

    folder = locate(model, REFERENCE_WORKFLOW if partition == REFERENCE_PARTITION else T2VA, revision, token, with_text_encoder=False).folder / partition
    index = folder / INDEX_NAME
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    else:
        weight_map = {}
    found: dict[str, torch.Tensor] = {}
    for name in names:
        file = folder / weight_map.get(name, WEIGHTS_NAME)
        if not file.is_file():
            raise H3AppError(f"{model}'s {partition} has no {file.name} holding {name}: give the model the adapter is for.")
        with safe_open(str(file), framework="pt") as handle:
            if name not in handle.keys():
                raise H3AppError(f"{model}'s {partition} has no weight {name}: give the model the adapter is for.")
            found[name] = handle.get_tensor(name)
    return found

