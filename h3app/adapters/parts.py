"""An adapter's parts beyond A/B pairs, from the header alone: exact deltas, replacements and a head bank.

- ``<module>.diff`` / ``<module>.diff_b``: an exact delta Δ of the module's weight / bias, applied as
  ``W + strength · Δ`` (Δ in fp32; no alpha, no rank). FastVideo's FastH3 puts them on the boundary modules and on
  1-D norm weights and biases.
- ``<module>.set_weight`` / ``<module>.set_bias``: a replacement of the weight / bias; strength does not apply.
- a head bank: ``proj_out.weight [n, out, in]`` (+ ``proj_out.bias [n, out]``) and its audio twin under plain
  parameter names, recognised by the leading bank dimension (alibaba-pai's PDD Acc adapters). Each evaluation runs
  the heads combined for its interval of the schedule (``h3app.adapters.head_bank``).

Refused in one line: two parts on one parameter (two replacements, a delta and a replacement, two copies), a part on a
fused projection (native ``qkv_proj`` / ``mlp.fc1``: one tensor for several of the model's parameters), FastVideo's
VSA gates (``attn.to_gate_compress``: the model has no such module), a part for a parameter H3 does not have, and —
with the model known — a shape that does not fit.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import H3AppError
from ..rules.h3_modules import FULL_SIZE_CONFIG, TransformerShapes, transformer_shapes
from ..rules.module_rules import PLAIN, match_name
from .factor_checks import FLOAT_DTYPES
from .parameters import BANK_MODULES, BIAS, WEIGHT, is_adaln, native_norm, parameter_shapes
from .types import HeaderView

DIFF, DIFF_B, SET_WEIGHT, SET_BIAS = "diff", "diff_b", "set_weight", "set_bias"
PART_KINDS = (DIFF, DIFF_B, SET_WEIGHT, SET_BIAS)
DELTAS = (DIFF, DIFF_B)  # scaled by strength
REPLACEMENTS = (SET_WEIGHT, SET_BIAS)  # strength does not apply
LORA, HEAD_BANK = "lora", "head_bank"  # the other two entries of ``parts`` (inspect --json)
# Adapter kinds beyond plain pairs, counted in ``parts`` when present (``adapters/kinds``; DoRA: pairs with magnitudes).
ADAPTER_KIND_WORDS = {"lokr": "LoKr", "loha": "LoHa", "dora": "DoRA"}
_PARAMETER_OF = {DIFF: WEIGHT, DIFF_B: BIAS, SET_WEIGHT: WEIGHT, SET_BIAS: BIAS}
_PART_KEY = re.compile(r"\.(" + "|".join(PART_KINDS) + r")$")
_VSA_GATE = re.compile(r"(^|\.)attn\.to_gate_compress$")
_NATIVE_HEADS = {"final_layer.video_out": "proj_out", "final_layer.audio_out": "audio_proj_out"}
MAX_BANK = 1024  # heads per bank: PDD ships 32; more is not a head bank (and would cost O(n) per evaluation)
ADALN_PARTS = "adaln"  # --skip-parts adaln: every AdaLN part (pairs, deltas, replacements) is left out
SKIPPABLE_PARTS = (ADALN_PARTS,)

# A key (or a key's stem) with its wrapper prefixes stripped: (file partition, the prefix, the rest).
StripPrefix = Callable[[str], tuple[str, str, str]]


@dataclass(frozen=True)
class PartPlan:
    """One exact part: ``key`` in the file, its ``kind``, the canonical ``parameter`` it changes and its shape."""

    key: str
    kind: str
    module: str
    parameter: str
    shape: tuple[int, ...]
    dtype: str
    file_partition: str


@dataclass(frozen=True)
class BankPlan:
    """A head bank on ``module`` (``proj_out`` / ``audio_proj_out``): ``size`` heads of ``[out, in]``."""

    module: str
    weight_key: str
    bias_key: str | None
    size: int
    head_shape: tuple[int, int]
    dtype: str
    file_partition: str

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.weight_key,) + ((self.bias_key,) if self.bias_key else ())


@dataclass(frozen=True)
class PartsPlan:
    """Every exact part and head bank of a file (for one partition, once split)."""

    parts: tuple[PartPlan, ...] = ()
    banks: tuple[BankPlan, ...] = ()

    @property
    def keys(self) -> frozenset[str]:
        return frozenset([p.key for p in self.parts] + [k for b in self.banks for k in b.keys])

    def __bool__(self) -> bool:
        return bool(self.parts or self.banks)

    def only(self, file_partition: str) -> PartsPlan:
        return PartsPlan(tuple(p for p in self.parts if p.file_partition == file_partition),
                         tuple(b for b in self.banks if b.file_partition == file_partition))


def part_counts(lora_pairs: int, parts: Iterable[PartPlan], banks: Sequence[BankPlan],
                adapter_kinds: Mapping[str, int] | None = None) -> dict[str, int]:
    """``inspect --json``'s ``parts``: A/B pairs, each part kind, and the head bank's size (0 without one); then the
    modules of each adapter kind beyond plain LoRA that the file has (``lokr``, ``loha``: counted in ``lora`` too,
    as each becomes one exact pair; ``dora``: pairs with a magnitude), only where there are some."""
    kinds = Counter(p.kind for p in parts)
    return {LORA: lora_pairs, **{kind: kinds.get(kind, 0) for kind in PART_KINDS},
            HEAD_BANK: max((b.size for b in banks), default=0),
            **{kind: count for kind, count in sorted((adapter_kinds or {}).items()) if count}}


def describe_counts(counts: Mapping[str, int], banks: int) -> str:
    """``A/B 362 pairs (724 tensors), Δ 85 (diff 40, diff_b 45), replacements 0, head bank 32 × 2``."""
    deltas = counts.get(DIFF, 0) + counts.get(DIFF_B, 0)
    replaced = counts.get(SET_WEIGHT, 0) + counts.get(SET_BIAS, 0)
    pairs = counts.get(LORA, 0)
    made = counts.get("lokr", 0) + counts.get("loha", 0)  # LoKr/LoHa modules: an exact pair each, not two tensors
    stored = f"{2 * (pairs - made)} tensors" + (f" + {made} LoKr/LoHa modules as exact pairs" if made else "")
    text = f"A/B {pairs} pairs ({stored}), Δ {deltas}"
    if deltas:
        text += f" (diff {counts.get(DIFF, 0)}, diff_b {counts.get(DIFF_B, 0)})"
    text += f", replacements {replaced}"
    if replaced:
        text += f" (set_weight {counts.get(SET_WEIGHT, 0)}, set_bias {counts.get(SET_BIAS, 0)})"
    if counts.get(HEAD_BANK):
        text += f", head bank {counts[HEAD_BANK]} × {banks}"
    for kind, word in ADAPTER_KIND_WORDS.items():
        if counts.get(kind):
            text += f", {word} {counts[kind]}"
    return text


def check_note(counts: Mapping[str, int], a_strength: float, b_strength: float,
               low_rank_only: bool = False) -> str | None:
    """What the equivalence check must say when A and B differ in strength: about an adapter's exact parts (alpha
    rescales only the low-rank parts, exact deltas follow the strength alone; replacements and head banks ignore
    both), and about the adapter kinds beyond plain LoRA (what equivalence holds for them). None when nothing is to
    be said."""
    deltas = counts.get(DIFF, 0) + counts.get(DIFF_B, 0)
    if a_strength == b_strength:
        return None
    kinds = kinds_note(counts)
    if not deltas:
        return kinds
    return " ".join(filter(None, (_deltas_note(deltas, a_strength, b_strength, low_rank_only), kinds)))


def kinds_note(counts: Mapping[str, int]) -> str | None:
    """What holds for LoKr, LoHa and DoRA modules between alpha 8 / strength 1 and alpha 128 / strength 0.0625."""
    found = [f"{ADAPTER_KIND_WORDS[k]} ({counts[k]} modules)" for k in ADAPTER_KIND_WORDS if counts.get(k)]
    if not found:
        return None
    return (f"{', '.join(found)}: only alpha × strength enters (LoKr alpha / the decomposed factor's rank, LoHa "
            "alpha / rank, DoRA s = alpha / rank × strength inside its row norm, its magnitude applied in both), so "
            "they run identically in A and B; a LoKr with both factors whole ignores alpha (scale 1 × strength), so the "
            "check refuses an explicit alpha for it.")


def _deltas_note(deltas: int, a_strength: float, b_strength: float, low_rank_only: bool) -> str:
    if low_rank_only:
        return (f"B rescales only the low-rank parts: its {deltas} exact deltas run at A's strength {a_strength:g} "
                "(alpha does not apply to them), so A and B must be identical.")
    return (f"this adapter carries {deltas} exact deltas (.diff/.diff_b) besides its low-rank pairs: alpha does not "
            f"apply to them, they follow the strength alone, so A runs them at {a_strength:g} and B at "
            f"{b_strength:g} — A and B are not the same run although alpha × scale is equal. The low-rank parts "
            "alone are equivalent: rerun with --low-rank-only (B's deltas at A's strength) for the comparison that "
            "must be identical.")


def plan_parts(view: HeaderView, keys: Sequence[str], strip: StripPrefix) -> tuple[PartsPlan, list[str]]:
    """``(the exact parts and head banks among keys, the keys left for the LoRA planner)``; ``H3AppError`` for a part
    h3app refuses whatever the model (see the module docstring)."""
    name = view.name
    parts: list[PartPlan] = []
    heads: dict[tuple[str, str], dict[str, str]] = {}
    rest: list[str] = []
    for key in keys:
        found = _PART_KEY.search(key)
        if found is None:
            partition, _, stripped = strip(key)
            module, _, attr = stripped.rpartition(".")
            module = _NATIVE_HEADS.get(module, module)
            dtype, shape = view.tensors[key]
            if module in BANK_MODULES and len(shape) == (3 if attr == WEIGHT else 2) and attr in (WEIGHT, BIAS):
                heads.setdefault((partition, module), {})[attr] = key
            else:
                rest.append(key)
            continue
        kind = found.group(1)
        partition, _, stem = strip(key[:found.start()])
        dtype, shape = view.tensors[key]
        module = _module_of(name, key, stem, kind)
        if dtype not in FLOAT_DTYPES:
            raise H3AppError(f"{name}: {key!r} is {dtype}, not a floating-point tensor: the file is damaged; re-export it.")
        parts.append(PartPlan(key, kind, module, f"{module}.{_PARAMETER_OF[kind]}", tuple(shape), dtype, partition))
    _refuse_duplicate_parameters(name, parts)
    order = sorted(heads, key=lambda pair: (pair[0], BANK_MODULES.index(pair[1])))
    banks = [_bank(view, partition, module, heads[(partition, module)]) for partition, module in order]
    return PartsPlan(tuple(parts), tuple(banks)), rest


def _module_of(name: str, key: str, stem: str, kind: str) -> str:
    """The canonical module a part's (prefix-stripped) stem names."""
    if _VSA_GATE.search(stem):
        raise H3AppError(
            f"{name} carries FastVideo VSA attention gates (e.g. {key!r}) for a module the model does not have: the "
            "file needs the VSA attention backend, which the diffusers MiniMax-H3 transformer does not have; use the "
            "non-VSA (dense) file of this adapter.")
    found = match_name(stem, False)
    if found is not None:
        alternative, groups, _ = found
        if alternative.rule.layout != PLAIN:
            raise H3AppError(
                f"{name}: {key!r} is an exact {kind} part on the fused projection {stem!r}, which the model keeps as "
                "separate parameters: h3app applies exact parts to single parameters only; convert the file to "
                "diffusers names (to_q/to_k/to_v, ff.net.0.proj).")
        return alternative.rule.targets[0].format(*groups)
    return native_norm(stem) or stem


def _refuse_duplicate_parameters(name: str, parts: Sequence[PartPlan]) -> None:
    seen: dict[tuple[str, str], PartPlan] = {}
    for part in parts:
        key = (part.file_partition, part.parameter)
        other = seen.get(key)
        if other is None:
            seen[key] = part
            continue
        if part.kind in REPLACEMENTS and other.kind in REPLACEMENTS:
            what = "two replacements of one parameter"
        elif part.kind in REPLACEMENTS or other.kind in REPLACEMENTS:
            what = "a replacement and a delta of one parameter (the replacement would discard the delta)"
        else:
            what = "two deltas of one parameter (two copies of one adapter)"
        raise H3AppError(f"{name}: {other.key!r} and {part.key!r} are {what} ({part.parameter}): keep one.")


def refuse_part_conflicts(name: str, plan: PartsPlan, lora_targets: Iterable[tuple[str, str, str]]) -> None:
    """Refuse what one file cannot mean: a replacement of a weight that an A/B pair also changes (the replacement
    would discard the pair), and a head bank beside any other part on its head. ``lora_targets``: ``(file
    partition, canonical target, stem)`` of every A/B pair."""
    pairs = {(partition, target): stem for partition, target, stem in lora_targets}
    for part in plan.parts:
        stem = pairs.get((part.file_partition, part.module))
        if part.kind == SET_WEIGHT and stem is not None:
            raise H3AppError(f"{name}: {part.key!r} replaces the weight that the A/B pair of {stem!r} changes: the "
                             "replacement would discard the pair; keep one.")
    for bank in plan.banks:
        other = [p.key for p in plan.parts if p.file_partition == bank.file_partition and p.module == bank.module]
        other += [stem for (partition, target), stem in pairs.items()
                  if partition == bank.file_partition and target == bank.module]
        if other:
            raise H3AppError(f"{name}: the {bank.module} head bank ({bank.weight_key!r}) and {other[0]!r} both change "
                             f"{bank.module}: the bank replaces the head at every evaluation; keep one.")


def _bank(view: HeaderView, partition: str, module: str, found: Mapping[str, str]) -> BankPlan:
    name = view.name
    weight_key, bias_key = found.get(WEIGHT), found.get(BIAS)
    if weight_key is None:
        raise H3AppError(f"{name}: {bias_key!r} is a bank of biases without its bank of {module} weights: the file "
                         "is incomplete; re-download it.")
    dtype, shape = view.tensors[weight_key]
    size, out_features, in_features = shape
    if dtype not in FLOAT_DTYPES or not 1 <= size <= MAX_BANK:
        raise H3AppError(f"{name}: {weight_key!r} ({dtype} {list(shape)}) is not a bank of heads (1 to {MAX_BANK} "
                         "floating-point heads): re-export it.")
    if bias_key is not None and tuple(view.tensors[bias_key][1]) != (size, out_features):
        raise H3AppError(f"{name}: {bias_key!r} is {list(view.tensors[bias_key][1])}, but its bank of weights "
                         f"{list(shape)} needs [{size}, {out_features}]: the file is damaged; re-export it.")
    return BankPlan(module, weight_key, bias_key, int(size), (int(out_features), int(in_features)), dtype, partition)


# ------------------------------------------------------------------------------------------------ fit, pruned bases
def check_parts_fit(plan: PartsPlan, shapes: TransformerShapes | None, name: str) -> list[str]:
    """Refuse a part for a parameter H3 does not have or (with the model in use, ``shapes``) one that does not fit;
    without a model, a misfit against the full-size H3 is a warning (returned)."""
    full = shapes is None
    params = parameter_shapes(shapes if shapes is not None else _full_size())
    known = {_pattern(p) for p in params}
    warnings: list[str] = []
    for part in plan.parts:
        expected = params.get(part.parameter)
        if expected is None and _pattern(part.parameter) not in known:
            raise H3AppError(f"{name}: {part.key!r} is an exact {part.kind} part for {part.parameter!r}, a parameter "
                             "MiniMax-H3 does not have: it is not an H3 adapter, or a layout h3app does not know.")
        if expected == part.shape:
            continue
        problem = (f"{part.key!r} is {list(part.shape)} but the model's {part.parameter} is "
                   f"{list(expected) if expected is not None else 'absent'}{_bank_hint(part, expected)}")
        if full:
            warnings.append(f"{name}: {problem} (the full-size H3): fine if it is for a smaller model.")
            continue
        raise H3AppError(f"{name} does not fit the model in use: {problem}; nothing was applied.")
    for bank in plan.banks:
        expected = params.get(f"{bank.module}.{WEIGHT}")
        if expected != bank.head_shape:
            head = list(expected) if expected is not None else "absent"  # a model without the module: say so, not crash
            problem = f"its {bank.module} head bank has heads of {list(bank.head_shape)}, the model's head is {head}"
            if full:
                warnings.append(f"{name}: {problem} (the full-size H3): fine if it is for a smaller model.")
                continue
            raise H3AppError(f"{name} does not fit the model in use: {problem}; nothing was applied.")
    return warnings


def _bank_hint(part: PartPlan, expected: tuple[int, ...] | None) -> str:
    module = part.module
    if part.kind in REPLACEMENTS and module in BANK_MODULES and expected and part.shape[1:] == expected[1:] \
            and part.shape[0] % expected[0] == 0 and part.shape[0] > expected[0]:
        return (f" ({part.shape[0] // expected[0]} stacked heads: a ComfyUI-converted head bank; use the vendor's "
                "file, whose bank h3app applies per evaluation)")
    return ""


def _pattern(parameter: str) -> str:
    return re.sub(r"\.\d+\.", ".N.", parameter)


def _full_size() -> TransformerShapes:
    return transformer_shapes(FULL_SIZE_CONFIG)


@dataclass(frozen=True)
class AdalnWidth:
    """An AdaLN part whose input is not the model's time embedding: ``width`` wide where the model has ``model``."""

    what: str
    width: int
    model: int


def pruned_adaln(lora_widths: Iterable[tuple[str, str, int]], plan: PartsPlan,
                 shapes: TransformerShapes) -> list[AdalnWidth]:
    """The AdaLN weight parts (``(key, target, in_features)`` of the LoRA modules, and the exact weight parts) whose
    input width differs from the model's: a file built for a *pruned* H3 checkpoint, whose AdaLN projections read an
    8-wide curve basis instead of the time embedding."""
    found: list[AdalnWidth] = []
    for key, target, width in lora_widths:
        linear = shapes.linears.get(target)
        if is_adaln(target) and linear is not None and width != linear.in_features:
            found.append(AdalnWidth(key, width, linear.in_features))
    for part in plan.parts:
        linear = shapes.linears.get(part.module)
        if is_adaln(part.module) and linear is not None and part.kind in (DIFF, SET_WEIGHT) \
                and len(part.shape) == 2 and part.shape[1] != linear.in_features:
            found.append(AdalnWidth(part.key, part.shape[1], linear.in_features))
    return found


def pruned_refusal(name: str, found: Sequence[AdalnWidth], adaln_parts: int, other_parts: int) -> str:
    """The one line for a pruned-base file: what it was built for, and how to apply the rest."""
    widths = sorted({f.width for f in found})
    return (f"{name} was built for a pruned H3 checkpoint: its AdaLN parts read a {'/'.join(map(str, widths))}-wide "
            f"curve basis (e.g. {found[0].what!r}) where this model's AdaLN input is {found[0].model} wide, so its "
            f"{adaln_parts} AdaLN parts cannot bind; add --skip-parts {ADALN_PARTS} to apply the other {other_parts} "
            "parts without them, or use the file made for the full model.")


def check_skip_parts(skip: Iterable[str]) -> tuple[str, ...]:
    """The skip list, checked: each one of :data:`SKIPPABLE_PARTS`."""
    skip = tuple(dict.fromkeys(str(s).strip().lower() for s in skip if str(s).strip()))
    unknown = [s for s in skip if s not in SKIPPABLE_PARTS]
    if unknown:
        raise H3AppError(f"--skip-parts {unknown[0]!r} is not a part kind that can be skipped: use "
                         f"{', '.join(SKIPPABLE_PARTS)}.")
    return skip
