"""The one door to diffusers' private API, for diffusers 0.42.1 (refused at import on any other version).

h3app uses diffusers' public API everywhere else. What only a private name does:

- ``context_parallel_plan``: the model's own context-parallel plan (``_cp_plan``). ``enable_parallelism`` takes a
  plan; h3app passes the model's own with its two output gathers moved (h3app/parallel/context_parallel.py).
- ``is_parallel`` / ``context_parallel_group``: whether ``enable_parallelism`` ran (``_parallel_config``) and the
  process group of its flattened ring × ulysses mesh (``context_parallel_config._flattened_mesh``), the group the
  moved gather runs on.
- ``gather_sizes``: every rank's row count (``diffusers.models._modeling_parallel.gather_size_by_comm``), diffusers'
  own choice of gather device for a mixed gloo/NCCL group.
- ``one_device_without_accelerator``: ``ModelMixin._resolve_parallel_config`` places rank r on
  ``rank % torch.accelerator.device_count()``, a division by zero on a machine without accelerator.
- ``fp32_modules``: the modules ``from_pretrained`` keeps in fp32 (``_keep_in_fp32_modules``), for models built
  without ``from_pretrained`` (the full-size rehearsal builds them on the meta device).
- ``per_clip_methods``: the video VAE's ``_encode_clip`` / ``_decode_clip`` (one temporal clip each, spatially tiled),
  which the full-size rehearsal runs once per clip shape and replays for the others (``hardware.replay``).
- ``register_cache_block``: diffusers' cache hooks find a block's ``hidden_states`` through
  ``hooks._helpers.TransformerBlockRegistry``, which does not list H3's block in this version; and
  ``first_block_computed``: whether the first-block cache's last decision was to compute the other blocks (its
  shared state, reached through the leader hook's registered name ``_FBC_LEADER_BLOCK_HOOK``).

diffusers itself is imported inside the functions: importing this module only checks the version.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..rules.versions import check_written_for

WRITTEN_FOR = "0.42.1"
check_written_for("diffusers", WRITTEN_FOR, __name__)


def context_parallel_plan(model: Any) -> dict[str, Any] | None:
    """The model's own context-parallel plan (module name → split/gather specs), None when it has none."""
    return getattr(model, "_cp_plan", None)


def is_parallel(model: Any) -> bool:
    """Whether ``enable_parallelism`` has run on ``model``."""
    return getattr(model, "_parallel_config", None) is not None


def context_parallel_group(model: Any) -> Any:
    """The process group of the context-parallel mesh ``enable_parallelism`` built for ``model`` (all its ranks)."""
    return model._parallel_config.context_parallel_config._flattened_mesh.get_group()


def gather_sizes(size: int, group: Any) -> list[int]:
    """Every rank's ``size`` (rank order), gathered over ``group``."""
    from diffusers.models._modeling_parallel import gather_size_by_comm

    return gather_size_by_comm(size, group)


@contextmanager
def one_device_without_accelerator() -> Iterator[None]:
    """Inside, ``torch.accelerator.device_count()`` is at least 1 (every CPU rank then uses ``cpu:0``, the only
    device there is); outside, and with a real accelerator, untouched."""
    import torch

    if torch.accelerator.device_count() > 0:
        yield
        return
    original = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.accelerator.device_count = original  # type: ignore[assignment]


def fp32_modules(model: Any) -> tuple[str, ...]:
    """Names of the submodules ``from_pretrained`` keeps in fp32 whatever the dtype (with their children)."""
    return tuple(getattr(model, "_keep_in_fp32_modules", None) or ())


VIDEO_VAE_CLIP_METHODS = ("_encode_clip", "_decode_clip")


def per_clip_methods(vae: Any) -> list[tuple[Any, str]]:
    """``(vae, name)`` of the video VAE's per-clip encode and decode: ``encode``/``decode`` cut a video into clips of
    one shape (``clip_length`` frames; ``tokens_chunk_size`` latent frames) and run each through these."""
    return [(vae, name) for name in VIDEO_VAE_CLIP_METHODS if callable(getattr(vae, name, None))]


def register_cache_block(block_class: type) -> None:
    """Let diffusers' cache hooks wrap ``block_class``, whose forward takes ``hidden_states`` first and returns the
    new hidden states alone (H3's ``MiniMaxH3TransformerBlock``)."""
    from diffusers.hooks._helpers import TransformerBlockMetadata, TransformerBlockRegistry

    try:
        TransformerBlockRegistry.get(block_class)
    except ValueError:
        # None: the block returns its hidden states alone (diffusers annotates both indices ``int`` yet defaults them
        # to None, the value its own hooks test for)
        alone = TransformerBlockMetadata(return_hidden_states_index=None,  # type: ignore[arg-type]
                                         return_encoder_hidden_states_index=None)  # type: ignore[arg-type]
        TransformerBlockRegistry.register(block_class, alone)


def first_block_computed(head_block: Any) -> bool:
    """Whether the first-block cache on ``head_block`` (the leader) decided, at its last forward, to compute the
    remaining blocks (False: they were skipped and the cached residual reused)."""
    from diffusers.hooks import HookRegistry
    from diffusers.hooks.first_block_cache import _FBC_LEADER_BLOCK_HOOK, FBCHeadBlockHook

    hook = HookRegistry.check_if_exists_or_initialize(head_block).get_hook(_FBC_LEADER_BLOCK_HOOK)
    if not isinstance(hook, FBCHeadBlockHook):
        raise RuntimeError(f"no first-block cache leader hook on {type(head_block).__name__} (found {hook!r})")
    return bool(hook.state_manager.get_state().should_compute)
