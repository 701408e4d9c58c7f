"""Per-modality strength on the rows a layer computes: the token tags of the forward now running, each adapter's
modality factors as an fp32 tensor refilled in place, and each bound layer's view of them.

The tags come from the transformer's own ``token_tags`` argument (0 video, 1 text, 2 audio per row of the packed
sequence), read by a forward pre-hook before the blocks run. With context parallel, diffusers splits the packed
sequence over the ranks before the first block (its "anything" sharders: ``tensor_split(ranks)[rank]`` over the
context-parallel group, which in h3app is every rank: ``--ulysses``/``--ring`` start exactly that many); each rank's
layers see only its own rows, so each rank takes the same split of the tags and its rows carry their own factors.
A layer whose row count is neither the whole sequence nor this rank's share is refused rather than guessed.

Under ``--compile`` the graphs read the tags and the factors as tensors: a slider change refills them in place and
recompiles nothing; switching an adapter between "every factor 1" and any other factors takes another graph once.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn as nn

from ..errors import H3AppError
from ..rules.modality import AUDIO, MODALITIES, MODALITY_BLOCKS, PACKED, TEXT, VIDEO, ModalityStrength

TAGS_ARGUMENT = "token_tags"


def local_rows(rows: torch.Tensor) -> torch.Tensor:
    """This rank's share of a per-row tensor of the packed sequence (the whole tensor without ranks)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return rows
    return rows.tensor_split(dist.get_world_size())[dist.get_rank()]


class RowTags:
    """The token tags of the forward now running (``full``: the packed sequence; ``local``: this rank's rows), set
    by a forward pre-hook on the transformer while any attached adapter has modality factors other than 1."""

    def __init__(self) -> None:
        self.full: torch.Tensor | None = None
        self.local: torch.Tensor | None = None
        self._handle: Any = None
        self._index: int | None = None

    @property
    def listening(self) -> bool:
        return self._handle is not None

    def listen(self, transformer: nn.Module) -> None:
        if self._handle is None:
            names = list(inspect.signature(type(transformer).forward).parameters)[1:]
            self._index = names.index(TAGS_ARGUMENT) if TAGS_ARGUMENT in names else None
            self._handle = transformer.register_forward_pre_hook(self._before, with_kwargs=True)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self.full = self.local = None

    def _before(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        tags = kwargs.get(TAGS_ARGUMENT)
        if tags is None and self._index is not None and len(args) > self._index:
            tags = args[self._index]
        if not isinstance(tags, torch.Tensor):
            raise H3AppError("per-modality strength needs the transformer's token_tags (one per row), and this "
                             "forward has none: is it an H3 transformer?")
        self.full = tags
        self.local = local_rows(tags)

    def for_rows(self, rows: int) -> torch.Tensor:
        """The tags of a layer input with ``rows`` rows of the sequence: the whole sequence's, or this rank's."""
        full, local = self.full, self.local
        if full is not None and rows == full.shape[0]:
            return full
        if local is not None and rows == local.shape[0]:
            return local
        seen = "no forward of the transformer" if full is None else (
            f"the sequence has {full.shape[0]} rows, this rank {local.shape[0] if local is not None else '-'}")
        raise H3AppError(f"per-modality strength: a layer ran on {rows} rows but {seen}: its rows cannot be told "
                         f"apart; set every modality strength to 1 for this run.")


class ModalityFactors:
    """One adapter's modality factors: ``strength`` (float64 values) and, per device, one fp32 ``[3]`` tensor in
    token-tag order, refilled in place. ``active`` is False while every factor is 1 (layers then skip them)."""

    def __init__(self, strength: ModalityStrength, tags: RowTags) -> None:
        self.tags = tags
        self._tensors: dict[torch.device, torch.Tensor] = {}
        self.strength = strength
        self.active = not strength.is_unit

    def update(self, strength: ModalityStrength) -> None:
        self.strength = strength
        self.active = not strength.is_unit
        values = torch.tensor(strength.factors, dtype=torch.float64)
        for tensor in self._tensors.values():
            tensor.copy_(values)

    def tensor(self, device: torch.device) -> torch.Tensor:
        device = torch.device(device)
        if device not in self._tensors:
            values = torch.tensor(self.strength.factors, dtype=torch.float64)
            self._tensors[device] = values.to(device=device, dtype=torch.float32)
        return self._tensors[device]


class RowFactors:
    """A bound layer's view of one adapter's modality factors: ``kind`` says which rows the layer computes
    (``h3app.rules.modality.rows_of``). The single-modality view is a 0-dim view of the ``[3]`` tensor (made
    once, refilled with it)."""

    def __init__(self, factors: ModalityFactors, kind: str, device: torch.device) -> None:
        self.factors = factors
        self.kind = kind
        self.values = factors.tensor(device)
        self.single = self.values[MODALITIES.index(kind)] if kind in (VIDEO, TEXT, AUDIO) else None

    def rows(self, x: torch.Tensor) -> torch.Tensor | None:
        """Factors for the rows of ``x [..., rows, in]``: ``x.shape[:-1]`` (packed rows, by their tags), 0-dim (one
        modality's rows), or None (all 1, or not a row-wise layer)."""
        if not self.factors.active:
            return None
        if self.single is not None:
            return self.single
        if self.kind != PACKED:
            return None
        tags = self.factors.tags.for_rows(x.shape[-2])
        if tags.device != self.values.device:
            tags = tags.to(self.values.device)
        return self.values.index_select(0, tags).expand(x.shape[:-1])

    def out_blocks(self) -> torch.Tensor | None:
        """The ``[3]`` factors of the output's modality blocks (the AdaLN projection), None otherwise."""
        if self.kind == MODALITY_BLOCKS and self.factors.active:
            return self.values
        return None
