"""The key layouts of H3 adapter files, one entry each: its name (``inspect``'s ``format``), who writes it, the
naming family its module names come from (``rules/module_rules``), how it is told apart, the prefixes it is stored
under, and the row order of its fused QKV. The planner (``formats.py``), the factor checks and the adapter kinds
(``kinds/``) read a module's layout here; docs/adapters.md ("The four layouts") is this table in words.

Adding a layout: an entry below (and, if it names modules differently, a rule family in ``rules/module_rules.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCKED = "blocked"  # fused QKV rows [q; k; v]
INTERLEAVED = "interleaved"  # fused QKV rows [q_h, k_h, v_h] × heads


@dataclass(frozen=True)
class Layout:
    """One key layout. ``family``: the module-name rules it uses (``native``/``diffusers``, None: either);
    ``flattened``: every ``.`` of the module name written ``_`` after one of ``flat_prefixes``; ``slot_tell``: told by
    PEFT's adapter-slot infix (``.default.``); ``qkv``: its fused QKV row order when the file does not say."""

    name: str
    label: str
    writers: str
    family: str | None
    prefixes: tuple[str, ...] = ()
    flattened: bool = False
    slot_tell: bool = False
    qkv: str = BLOCKED


NATIVE = Layout("native", "the original checkpoint's names",
                "Larry Turbo, ai-toolkit, ComfyUI, LightX2V _comfyui files, LyCORIS via ComfyUI",
                "native", ("", "diffusion_model.", "model.diffusion_model."))
DIFFSYNTH = Layout("diffsynth", "native names with PEFT's .default. slot", "DiffSynth-Studio", "native",
                   ("", "diffusion_model."), slot_tell=True, qkv=INTERLEAVED)
PEFT = Layout("peft", "diffusers' names", "fal, LightX2V Turbo, diffusers, PEFT save_pretrained, SimpleTuner",
              "diffusers", ("", "transformer.", "base_model.model.", "base_model.model.transformer.", "transformer_ref."))
KOHYA = Layout("kohya", "flattened names (every . written _)", "musubi-tuner, kohya, LyCORIS, SimpleTuner's LyCORIS",
               None, ("lora_unet_", "lora_transformer_", "lycoris_"), flattened=True)
LAYOUTS: tuple[Layout, ...] = (NATIVE, DIFFSYNTH, PEFT, KOHYA)
BY_NAME = {layout.name: layout for layout in LAYOUTS}
FLATTENED_PREFIXES = tuple(p for layout in LAYOUTS if layout.flattened for p in layout.prefixes)


def layout_of(matched_flat: bool, family: str, has_slot: bool) -> Layout:
    """The layout of a module matched by the rule ``family`` (``native``/``diffusers``), flattened or not, with or
    without PEFT's adapter-slot infix."""
    if matched_flat:
        return KOHYA
    if family == NATIVE.family:
        return DIFFSYNTH if has_slot else NATIVE
    return PEFT


def qkv_order(layout: Layout, requested: str) -> str:
    """The fused QKV row order: the one requested (``--qkv-layout blocked|interleaved``), else the layout's."""
    return requested if requested != "auto" else layout.qkv
