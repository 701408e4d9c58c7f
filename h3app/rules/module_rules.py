"""The naming schemes of H3 LoRA files: one ``ModuleRule`` per module family of each scheme (the original
checkpoint's names, diffusers' names), compiled into one alternation so a module name costs one regex run.

``formats.py`` plans whole files with these; ``native_vocabulary`` is the inverse (native names → shapes), for
writing native files.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .h3_modules import BLOCK_LINEARS, TransformerShapes

# How a module's lora_B rows map onto its canonical targets.
PLAIN = "plain"  # one target, rows as stored
FUSED_QKV = "fused_qkv"  # three targets to_q/to_k/to_v sharing lora_A; B rows split in thirds (after de-interleave)
SWIGLU_GATE_UP = "swiglu_gate_up"  # native fc1 [gate; up] → diffusers ff.net.0.proj [up; gate]: halves swapped


@dataclass(frozen=True)
class ModuleRule:
    """One module family of a naming scheme: ``pattern`` fullmatches the (dotted) module name; ``targets`` are
    canonical names with ``{0}`` for the block index."""

    pattern: str
    targets: tuple[str, ...]
    layout: str = PLAIN


def _qkv(block: str) -> tuple[str, ...]:
    return tuple(f"{block}.attn.to_{p}" for p in "qkv")


# The original checkpoint's names (native, diffsynth; kohya when flattened).
NATIVE_MODULES: tuple[ModuleRule, ...] = (
    ModuleRule(r"blocks\.(\d+)\.attn\.qkv_proj", _qkv("transformer_blocks.{0}"), FUSED_QKV),
    ModuleRule(r"blocks\.(\d+)\.attn\.out_proj", ("transformer_blocks.{0}.attn.to_out.0",)),
    ModuleRule(r"blocks\.(\d+)\.mlp\.fc1", ("transformer_blocks.{0}.ff.net.0.proj",), SWIGLU_GATE_UP),
    ModuleRule(r"blocks\.(\d+)\.mlp\.fc2", ("transformer_blocks.{0}.ff.net.2",)),
    ModuleRule(r"blocks\.(\d+)\.adaln_proj\.linear", ("transformer_blocks.{0}.adaln_proj.linear",)),
    ModuleRule(r"token_refiner\.blocks\.(\d+)\.attn\.qkv_proj", _qkv("token_refiner.refiner_blocks.{0}"), FUSED_QKV),
    ModuleRule(r"token_refiner\.blocks\.(\d+)\.attn\.out_proj", ("token_refiner.refiner_blocks.{0}.attn.to_out.0",)),
    ModuleRule(r"token_refiner\.blocks\.(\d+)\.mlp\.fc1", ("token_refiner.refiner_blocks.{0}.ff.net.0.proj",), SWIGLU_GATE_UP),
    ModuleRule(r"token_refiner\.blocks\.(\d+)\.mlp\.fc2", ("token_refiner.refiner_blocks.{0}.ff.net.2",)),
    ModuleRule(r"video_patch_proj", ("proj_in",)),
    ModuleRule(r"audio_patch_proj", ("audio_proj_in",)),
    ModuleRule(r"condition_proj", ("context_embedder",)),
    ModuleRule(r"time_embedder\.proj_in", ("time_embedder.linear_1",)),
    ModuleRule(r"time_embedder\.proj_out", ("time_embedder.linear_2",)),
    ModuleRule(r"final_layer\.adaln_proj\.linear", ("norm_out.linear",)),
    ModuleRule(r"final_layer\.video_out", ("proj_out",)),
    ModuleRule(r"final_layer\.audio_out", ("audio_proj_out",)),
)


def _diffusers_block_rules(block: str, with_adaln: bool) -> tuple[ModuleRule, ...]:
    pattern = re.escape(block) + r"\.(\d+)\."
    target = block + ".{0}."
    subs = list(BLOCK_LINEARS)
    if with_adaln:
        subs.append("adaln_proj.linear")
    rules = [ModuleRule(pattern + re.escape(sub), (target + sub,)) for sub in subs]
    # A PEFT adapter trained on diffusers' fused projections (`fuse_projections()`): blocked [q; k; v].
    rules.append(ModuleRule(pattern + r"attn\.to_qkv", _qkv(block + ".{0}"), FUSED_QKV))
    return tuple(rules)


# diffusers' own names (peft; kohya when flattened): the canonical names themselves.
DIFFUSERS_MODULES: tuple[ModuleRule, ...] = (
    *_diffusers_block_rules("transformer_blocks", with_adaln=True),
    *_diffusers_block_rules("token_refiner.refiner_blocks", with_adaln=False),
    *(
        ModuleRule(re.escape(name), (name,))
        for name in ("proj_in", "audio_proj_in", "context_embedder", "time_embedder.linear_1",
                     "time_embedder.linear_2", "norm_out.linear", "proj_out", "audio_proj_out")
    ),
)


@dataclass(frozen=True, eq=False)  # hashed by identity: one object per rule and spelling
class Alternative:
    """One rule inside a compiled alternation: its family, the rule, and where its own groups sit in ``groups()``."""

    family: str
    rule: ModuleRule
    first: int
    last: int
    alone: re.Pattern[str]  # the rule's pattern by itself (for a match object of its own)


class _Rules:
    """Every rule of both naming families (native first) compiled into one alternation, dotted or flattened (every
    ``.`` written as ``_``): one regex run per module name. Rule ``i`` is wrapped in its own group, which closes
    last, so ``lastindex`` names the rule and its own ``(\\d+)`` groups follow it."""

    def __init__(self, families: Sequence[tuple[str, Sequence[ModuleRule]]], flat: bool) -> None:
        self.by_group: dict[int, Alternative] = {}
        parts: list[str] = []
        group = 1
        for family, rules in families:
            for rule in rules:
                alone = re.compile(rule.pattern.replace(r"\.", "_") if flat else rule.pattern)
                self.by_group[group] = Alternative(family, rule, group, group + alone.groups, alone)
                parts.append(f"({alone.pattern})")
                group += 1 + alone.groups
        self.any = re.compile("|".join(parts))

    def match(self, name: str) -> tuple[Alternative, tuple[str, ...]] | None:
        """The alternative ``name`` fullmatches and its own groups (each a ``(\\d+)`` that took part, so a str)."""
        found = self.any.fullmatch(name)
        if found is None or found.lastindex is None:  # every alternative is a group: a match always sets lastindex
            return None
        alternative = self.by_group[found.lastindex]
        return alternative, found.groups()[alternative.first:alternative.last]


_FAMILIES = (("native", NATIVE_MODULES), ("diffusers", DIFFUSERS_MODULES))
_DOTTED_RULES = _Rules(_FAMILIES, flat=False)
_FLAT_RULES = _Rules(_FAMILIES, flat=True)


def match_name(name: str, flattened: bool) -> tuple[Alternative, tuple[str, ...], bool] | None:
    """The rule a prefix-stripped module name matches: ``(alternative, its groups, matched_flattened)``."""
    if not flattened:
        found = _DOTTED_RULES.match(name)
        if found is not None:
            return (*found, False)
    found = _FLAT_RULES.match(name.replace(".", "_"))
    return None if found is None else (*found, True)


def match_module(name: str, flattened: bool) -> tuple[str, ModuleRule, re.Match[str], bool] | None:
    """Find the rule for a prefix-stripped module name: ``(family, rule, match, matched_flattened)``.

    Dotted names are matched as they are; flattened (or hybrid) names are matched against the vocabulary with every
    ``.`` written as ``_``, which is unambiguous because each rule is a full match over a fixed structure. The
    first rule that matches wins (native before diffusers, each table in order).
    """
    found = match_name(name, flattened)
    if found is None:
        return None
    alternative, _, matched_flat = found
    text = name.replace(".", "_") if matched_flat else name
    match = alternative.alone.fullmatch(text)
    assert match is not None, f"{name!r} matched the alternation but not its own rule {alternative.rule.pattern!r}"
    return alternative.family, alternative.rule, match, matched_flat


def dotted_name(rule: ModuleRule, groups: tuple[str, ...]) -> str:
    """The dotted module name ``rule`` gives for ``groups`` (its pattern with each ``(\\d+)`` filled in):
    ``blocks\\.(\\d+)\\.mlp\\.fc1`` with ``("3",)`` → ``blocks.3.mlp.fc1``."""
    name = rule.pattern
    for group in groups:
        name = name.replace(r"(\d+)", group, 1)
    return name.replace("\\.", ".")


def native_vocabulary(shapes: TransformerShapes) -> dict[str, tuple[int, int]]:
    """Every native (original checkpoint) LoRA-able module of a transformer → its ``(out, in)``; fused QKV and
    SwiGLU ``fc1`` have their fused row counts. The inverse of ``NATIVE_MODULES``, for writing native files."""
    vocabulary: dict[str, tuple[int, int]] = {}
    for rule in NATIVE_MODULES:
        if r"(\d+)" in rule.pattern:
            count = shapes.num_refiner_layers if rule.pattern.startswith("token_refiner") else shapes.num_layers
            indices: list[tuple[str, ...]] = [(str(i),) for i in range(count)]
        else:
            indices = [()]
        for groups in indices:
            name = dotted_name(rule, groups)
            targets = [t.format(*groups) for t in rule.targets]
            if targets[0] not in shapes:
                continue
            first = shapes[targets[0]]
            rows = first.out_features * len(targets)
            vocabulary[name] = (rows, first.in_features)
    return vocabulary
