"""What sglang (multimodal_gen, MiniMax H3) would run for an adapter, and the flags that make it run h3app's scales.

sglang's own rules, per module of the adapter (h3app's names, diffusers layout):

1. A ``<module>.alpha`` tensor wins over everything, read with ``int()`` (truncated). PEFT ``alpha_pattern`` entries
   (adapter_config.json, else the file's ``lora_adapter_metadata``) become such tensors at load, so they win over
   ``--lora-alpha`` too. Split ``to_q/to_k/to_v`` modules are fused into one ``qkv_proj``: a section's ``.alpha`` is
   folded into its factors exactly (a float); a group whose three sections all carry one cannot be read as one alpha.
2. Else the adapter alpha: ``--lora-alpha`` (an integer), else ``lora_alpha`` from adapter_config.json / the metadata.
3. Else alpha = rank.

Load refusals, whatever the flags: a ``lora_alpha`` or ``alpha_pattern`` value (config or metadata) that is not a
positive integer; a config and metadata alpha that disagree; a plain ``alpha``/``lora_alpha``/``network_alpha``
metadata entry that is not a positive integer (read only when the file has one rank or PEFT slot names); an
``alpha_pattern`` entry that contradicts the module's ``.alpha`` tensor. Scale = ``--lora-scale × alpha / rank``
(rsLoRA: ``B`` is multiplied by √rank, i.e. ``/ √rank``).

:func:`sglang_facts` records what those rules read (JSON, in ``AdapterInfo.sglang``); :func:`solve_flags` finds
``--lora-alpha``/``--lora-scale`` that give every module h3app's effective scale, or the sentence saying why none do.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..rules.h3_modules import QKV
from ..rules.modality import ModalityStrength
from ..settings import AUDIO, BLOCKS, SCHEDULE, TEXT, VIDEO, recorded
from .formats import ModulePlan
from .types import HeaderView

PLAIN_METADATA_ALPHAS = ("lora_alpha", "network_alpha", "alpha")
METADATA_KEY = "lora_adapter_metadata"
_SLOT = re.compile(r"\.lora_[AB]\.[^.]+\.weight$")
_WRAPPERS = ("peft_model.base_model.model.", "base_model.model.")
_TOLERANCE = 1e-9


def sglang_facts(view: HeaderView, modules: Sequence[ModulePlan]) -> dict[str, Any]:
    """What sglang's alpha rules read from this file, per h3app target (JSON-able):
    ``{"modules": {target: {"rank", "tensor_alpha", "pattern_alpha", "qkv_group"}}, "config_lora_alpha",
    "metadata_lora_alpha", "plain_metadata_alphas", "pattern_values", "use_rslora"}`` (raw values as written)."""
    config = dict(view.adapter_config or {})
    packed = _metadata_config(view.metadata)
    patterns = config.get("alpha_pattern") if "alpha_pattern" in config else packed.get("alpha_pattern")
    patterns = patterns if isinstance(patterns, dict) else {}
    prefix = _uniform_wrapper([m.stem for m in modules])
    facts: dict[str, Any] = {}
    for module in modules:
        base = module.stem[len(prefix):]
        pattern = next((value for key, value in patterns.items() if _matches(str(key), base)), None)
        tensor = view.scalars.get(module.alpha_key) if module.alpha_key else None
        section = base.rsplit(".", 1)
        # sglang fuses q, k and v into qkv_proj (main and refiner blocks)
        qkv_group = section[0] if len(module.targets) == 1 and section[-1] in QKV else None
        for target in module.targets:
            facts[target] = {"rank": module.rank, "tensor_alpha": tensor, "pattern_alpha": pattern,
                             "qkv_group": qkv_group,
                             "kind": "dora" if module.magnitude_key else module.kind}  # lora, lokr, loha, dora
    ranks = {m.rank for m in modules}
    slotted = any(_SLOT.search(key) for key in view.tensors)
    plain = {key: view.metadata[key] for key in PLAIN_METADATA_ALPHAS if key in view.metadata}
    rslora = config.get("use_rslora", packed.get("use_rslora", False))
    return {
        "modules": facts,
        "config_lora_alpha": config.get("lora_alpha"),
        "metadata_lora_alpha": packed.get("lora_alpha"),
        "plain_metadata_alphas": plain if (slotted or len(ranks) == 1) else {},
        "pattern_values": {str(k): v for k, v in patterns.items()},
        "use_rslora": rslora is True,
    }


@dataclass(frozen=True)
class SglangFlags:
    """``--lora-alpha`` (None: leave it out) and ``--lora-scale`` that reproduce h3app's scales; ``exact`` is False
    when the flags reach the same product by another route (e.g. alpha = rank × a smaller scale); ``reason`` is the
    one sentence saying why no flags can (then ``alpha``/``scale`` are None)."""

    alpha: int | None
    scale: float | None
    exact: bool = True
    reason: str | None = None


def solve_flags(facts: Mapping[str, Any], h3app_scales: Mapping[str, float], strength: float) -> SglangFlags:
    """The flags under which sglang gives every target of ``facts`` the effective scale in ``h3app_scales``."""
    refusal = load_refusal(facts)
    if refusal is not None:
        return _none(f"sglang refuses to load this adapter: {refusal}, whatever --lora-alpha says")
    modules = facts["modules"]
    rslora = bool(facts.get("use_rslora"))
    default = _positive_int(facts.get("config_lora_alpha"))
    if default is None:
        default = _positive_int(facts.get("metadata_lora_alpha"))
    if default is None:
        default = next((_positive_int(v) for v in facts.get("plain_metadata_alphas", {}).values()), None)
    fixed: dict[str, float] = {}
    free: list[str] = []
    groups: dict[str, list[str]] = defaultdict(list)
    for target, fact in modules.items():
        if target not in h3app_scales:
            continue
        if fact.get("qkv_group") is not None:
            groups[fact["qkv_group"]].append(target)
        alpha = _fixed_alpha(fact)
        if alpha is None:
            free.append(target)
        else:
            fixed[target] = alpha
    for group, members in groups.items():
        if len(members) == 3 and all(t in fixed for t in members):
            return _none(f"sglang fuses {group}.to_q/to_k/to_v into one projection and cannot read their three "
                         f".alpha values as one alpha")
    divisor = {t: math.sqrt(modules[t]["rank"]) if rslora else float(modules[t]["rank"]) for t in h3app_scales
               if t in modules}
    scale = None
    if fixed:
        ratios = {t: h3app_scales[t] * divisor[t] / a if a else math.inf for t, a in fixed.items()}
        scale = next(iter(ratios.values()))
        if not math.isfinite(scale) or not all(_close(r, scale) for r in ratios.values()):
            shown = ", ".join(sorted({_fmt(a) for a in fixed.values()}))
            return _none(f"the file's .alpha tensors or alpha_pattern fix these modules at alpha {shown} in sglang "
                         f"(int()-truncated, and ahead of --lora-alpha), which no single --lora-scale turns into "
                         f"h3app's scales")
        if not free:
            return SglangFlags(None, scale)
    products = {t: h3app_scales[t] * divisor[t] for t in free}  # = alpha × scale that sglang must apply
    if scale is not None:
        wanted = {t: p / scale for t, p in products.items()}
        alpha = next(iter(wanted.values()))
        if all(_close(a, alpha) for a in wanted.values()) and _integral(alpha) and alpha > 0:
            return SglangFlags(int(round(alpha)), scale)
        if default is None and all(_close(a, modules[t]["rank"]) for t, a in wanted.items()):
            return SglangFlags(None, scale)
        return _none(f"the file's .alpha tensors fix --lora-scale at {_fmt(scale)} in sglang, which leaves alpha "
                     f"{', '.join(sorted({_fmt(a) for a in wanted.values()}))} for the other modules, not one "
                     f"positive integer --lora-alpha")
    product = next(iter(products.values()))
    if all(_close(p, product) for p in products.values()):
        alpha = product / strength if strength else math.nan
        if _integral(alpha) and alpha > 0:
            return SglangFlags(int(round(alpha)), strength)
        rank = Counter(modules[t]["rank"] for t in free).most_common(1)[0][0]
        return SglangFlags(rank, product / rank, exact=False)
    over_rank = {t: p / modules[t]["rank"] for t, p in products.items()}  # no flag, no file alpha: alpha = rank
    scale = next(iter(over_rank.values()))
    if default is None and all(_close(s, scale) for s in over_rank.values()):
        return SglangFlags(None, scale)
    return _none("h3app runs per-module alphas here that sglang's one --lora-alpha cannot express")


def load_refusal(facts: Mapping[str, Any]) -> str | None:
    """Why sglang's PEFT loader refuses the file whatever the flags, or None."""
    kinds = Counter(f.get("kind", "lora") for f in (facts.get("modules") or {}).values())
    other = sorted(k for k in kinds if k != "lora")
    if other:
        return (f"its {', '.join(f'{k} ({kinds[k]} targets)' for k in other)} modules are not plain LoRA pairs, and "
                "sglang's H3 LoRA loader applies plain pairs only (h3app's export writes LoKr/LoHa exactly as pairs)")
    values = [("adapter_config.json lora_alpha", facts.get("config_lora_alpha")),
              ("the file's lora_adapter_metadata lora_alpha", facts.get("metadata_lora_alpha"))]
    values += [(f"the file's metadata {k}", v) for k, v in (facts.get("plain_metadata_alphas") or {}).items()]
    values += [(f"alpha_pattern[{k!r}]", v) for k, v in (facts.get("pattern_values") or {}).items()]
    for where, value in values:
        if value is not None and _positive_int(value) is None:
            return f"{where} is {_show(value)} and sglang accepts only a positive integer there"
    config, metadata = (_positive_int(facts.get(k)) for k in ("config_lora_alpha", "metadata_lora_alpha"))
    plain = {_positive_int(v) for v in (facts.get("plain_metadata_alphas") or {}).values()}
    if len(plain) > 1 or (metadata is not None and plain and plain != {metadata}):
        return "the file's metadata gives conflicting alphas"
    if config is not None and (metadata is not None or plain) and config != (metadata or next(iter(plain))):
        return "adapter_config.json and the file's metadata give different lora_alpha"
    for target, fact in (facts.get("modules") or {}).items():
        tensor, pattern = fact.get("tensor_alpha"), fact.get("pattern_alpha")
        if tensor is not None and pattern is not None and int(tensor) != _positive_int(pattern):
            return f"its alpha_pattern gives {target} alpha {_show(pattern)} but its .alpha tensor says {_fmt(tensor)}"
    return None


def _fixed_alpha(fact: Mapping[str, Any]) -> float | None:
    """The alpha sglang gives a module ahead of the flags: its ``.alpha`` tensor (or alpha_pattern), ``int()``ed
    unless it is a q/k/v section (folded exactly)."""
    value = fact.get("tensor_alpha")
    if value is None and fact.get("pattern_alpha") is not None:
        value = _positive_int(fact["pattern_alpha"])
    if value is None:
        return None
    return float(value) if fact.get("qkv_group") is not None else float(int(value))


def _metadata_config(metadata: Mapping[str, str]) -> dict[str, Any]:
    try:
        packed = json.loads(metadata.get(METADATA_KEY) or "{}")
    except json.JSONDecodeError:
        return {}
    if not isinstance(packed, dict):
        return {}
    return {k[len("transformer."):]: v for k, v in packed.items() if k.startswith("transformer.")}


def _uniform_wrapper(stems: Sequence[str]) -> str:
    return next((p for p in _WRAPPERS if stems and all(s.startswith(p) for s in stems)), "")


def _matches(pattern: str, base: str) -> bool:
    try:
        return re.match(rf"(.*\.)?({pattern})$", base) is not None
    except re.error:
        return False


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0 or not float(value).is_integer():
        return None
    return int(value)


def _integral(value: float) -> bool:
    return math.isfinite(value) and abs(value - round(value)) <= _TOLERANCE * max(1.0, abs(value))


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_TOLERANCE, abs_tol=1e-15)


def _none(reason: str) -> SglangFlags:
    return SglangFlags(None, None, reason=f"No sglang command reproduces this run: {reason}.")


def _fmt(value: float) -> str:
    return f"{float(value):g}"


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else _fmt(value) if isinstance(value, (int, float)) else repr(value)


# --- advanced strength (docs/lora-engine.md "Advanced strength"): what sglang and diffusers cannot express --------
ADVANCED_TOOLS = ("sglang", "diffusers")


def advanced_strength_notes(adapter: Mapping[str, Any], tool: str) -> tuple[str, ...]:
    """One sentence per advanced strength of ``adapter`` (a run's settings JSON entry, ``settings.KNOBS``) that
    ``tool`` (``sglang`` or ``diffusers``) cannot apply as h3app does; empty when the adapter uses none."""
    if tool not in ADVANCED_TOOLS:
        raise ValueError(f"tool must be one of {ADVANCED_TOOLS}, got {tool!r}")
    name = "sglang" if tool == "sglang" else "diffusers (set_adapters)"
    one = "one --lora-scale" if tool == "sglang" else "one weight per adapter"
    notes = []
    given = {knob.name: value for knob, value in recorded(adapter).items()}
    modality = ModalityStrength(*(float(given[k.name]) for k in (VIDEO, TEXT, AUDIO)))
    if not modality.is_unit:
        notes.append(f"{name} applies {one} to every token row: per-modality strength ({modality.label}) has "
                     f"no equivalent there, so every row runs the adapter at its plain strength.")
    if given[SCHEDULE.name]:
        notes.append(f"{name} applies {one} to every denoising step: the strength schedule "
                     f"({given[SCHEDULE.name]}) has no equivalent there, so every step runs at the plain "
                     f"strength.")
    if given[BLOCKS.name]:
        notes.append(f"{name} applies {one} to every block: for the per-block strength ({given[BLOCKS.name]}) "
                     f"bake it into a file with `python -m h3app export {BLOCKS.flag} "
                     f"{given[BLOCKS.name]}` and load that file instead.")
    return tuple(notes)
