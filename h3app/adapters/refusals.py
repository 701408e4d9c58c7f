"""What h3app refuses to apply, recognised from key names alone, each refusal one line naming what was seen:
other adapter families (LyCORIS Tucker cores, Wan's modulation deltas, LoRA biases), LoRAs made for other models, and files
that hold no LoRA factors at all (a model checkpoint)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ..errors import H3AppError

# Adapter families h3app does not apply, recognised by how their keys end: ``.`` + one of these + end of key.
_FAMILY_ENDINGS: tuple[tuple[str, str, str], ...] = (
    (r"(hada|lokr)_t[12](\.weight)?", "a LyCORIS adapter with Tucker cores (hada_t/lokr_t: conv layers)",
     "MiniMax-H3 has no conv layer an adapter can target; use a LoKr/LoHa trained without use_tucker, or a LoRA"),
    (r"diff_m", "a Wan-style modulation delta (.diff_m)",
     "MiniMax-H3 has no raw modulation parameter (its modulation is the adaln_proj.linear Linear); use an H3 adapter"),
    (r"lora_B(\.[^.]+)?\.bias", "LoRA biases (lora_B.bias, PEFT lora_bias=True)",
     "h3app applies the low-rank weight delta only; export the adapter without lora_bias"),
)
_REFUSED_FAMILIES: tuple[tuple[re.Pattern[str], str, str], ...] = tuple(
    (re.compile(rf"\.(?:{ending})$"), what, fix) for ending, what, fix in _FAMILY_ENDINGS
)
# All of them at once, searched over every key joined by newlines (one call instead of one per key and family). A key
# that itself holds a newline can only make it fire without cause, which costs the exact per-family pass below.
_ANY_REFUSED_FAMILY = re.compile(r"\.(?:" + "|".join(f"(?:{ending})" for ending, _, _ in _FAMILY_ENDINGS) + ")$",
                                 re.MULTILINE)

# LoRAs for other video/image DiTs, recognised by module names H3 never uses (checked on the prefix-stripped stem,
# dotted and flattened).
_FOREIGN_MODELS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(^|\.)(img|txt)_attn_qkv(\.|$)|individual_token_refiner|(img|txt)_mod[._]linear|^hunyuan",
                re.IGNORECASE), "HunyuanVideo"),
    (re.compile(r"(^|[._])(double_blocks|single_blocks|single_transformer_blocks)[._]\d+|(^|[._])(txt_attn|img_attn)[._]"),
     "Flux (or HunyuanVideo)"),
    (re.compile(r"(^|[._])transformer_blocks[._]\d+[._]attn[12][._]"), "LTX-Video"),
    (re.compile(r"(^|[._])blocks[._]\d+[._](self_attn|cross_attn|ffn)[._]|(^|[._])blocks[._]\d+[._]attn[12][._]"
                r"|(^|[._])condition_embedder[._]"), "Wan"),
)


def refuse_families(name: str, keys: Sequence[str]) -> None:
    if not _ANY_REFUSED_FAMILY.search("\n".join(keys)):
        return
    for pattern, what, fix in _REFUSED_FAMILIES:
        seen = [k for k in keys if pattern.search(k)]
        if seen:
            raise H3AppError(f"{name} is {what} (e.g. {seen[0]!r}, {len(seen)} such keys): {fix}.")


def refuse_foreign(name: str, stem_names: Iterable[str]) -> None:
    stem_names = list(stem_names)
    for pattern, family in _FOREIGN_MODELS:
        seen = [s for s in stem_names if pattern.search(s)]
        if seen:
            raise H3AppError(
                f"{name} is made for {family}, not MiniMax-H3 (module names such as {seen[0]!r}): pick an H3 adapter."
            )


def refuse_no_lora(name: str, keys: Sequence[str], unparsed: Sequence[str]) -> None:
    plain = [k for k in keys if k.endswith((".weight", ".bias", ".scale"))]
    if plain and len(plain) >= len(keys) // 2:
        raise H3AppError(
            f"{name} holds {len(plain)} plain weights (e.g. {sorted(plain)[0]!r}) and no LoRA factors: it is a model "
            "checkpoint, not an adapter; pick a LoRA file (lora_A/lora_B or lora_down/lora_up keys)."
        )
    raise H3AppError(
        f"{name} holds no LoRA factors (first keys: {', '.join(sorted(keys)[:3])}): pick a LoRA file "
        "(lora_A/lora_B or lora_down/lora_up keys)."
    )
