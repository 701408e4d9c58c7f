"""Files built for a *pruned* H3 checkpoint, and parts left out on request (``--skip-parts adaln``).

A pruned H3 checkpoint drops the time embedder and feeds every AdaLN projection an 8-wide curve basis instead of the
2688-wide time embedding. Adapters made for it carry AdaLN pairs whose ``lora_A`` is 8 wide (plus, for some, a
constant ``.diff_b`` on the AdaLN bias: the rebased pair's constant term), and some ``_full`` files carry AdaLN
tensors at the pruned width. Such AdaLN parts cannot bind to the full model as they are (rebasing them needs the
checkpoint's own basis, which the file does not carry). The file is recognised by the input width of its AdaLN
parts, refused in one line that says what it was built for, and the rest of it applies when the person agrees to
leave every AdaLN part out.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from ..errors import H3AppError
from ..rules.h3_modules import FULL_SIZE_CONFIG, TransformerShapes, transformer_shapes
from .formats import AdapterPlan, ModulePlan
from .parameters import is_adaln
from .parts import ADALN_PARTS, LORA, PartsPlan, pruned_adaln, pruned_refusal


def _adaln_module(module: ModulePlan) -> bool:
    return any(is_adaln(target) for target in module.targets)


def apply_skips(plan: AdapterPlan, shapes: TransformerShapes | None, skip: tuple[str, ...], name: str,
                warnings: list[str]) -> tuple[AdapterPlan, dict[str, int]]:
    """``(the plan without the parts skipped, how many were skipped by kind)``. A pruned-base file is refused with
    the model in use (``shapes``) unless ``adaln`` is skipped; without a model it is a warning."""
    model = shapes if shapes is not None else transformer_shapes(FULL_SIZE_CONFIG)
    modules = plan.modules + plan.reference_modules
    widths = [(m.down_key, target, in_features) for m in modules
              for target, (_, in_features) in zip(m.targets, m.target_shapes)]
    found = pruned_adaln(widths, plan.file_parts, model)
    adaln_pairs = [m for m in plan.modules if _adaln_module(m)]
    adaln_parts = [p for p in plan.parts.parts if is_adaln(p.module)]
    if ADALN_PARTS not in skip:
        if found and shapes is not None:
            other = len(plan.modules) - len(adaln_pairs) + len(plan.parts.parts) - len(adaln_parts)
            raise H3AppError(pruned_refusal(name, found, len(adaln_pairs) + len(adaln_parts), other))
        if found:
            warnings.append(f"{name} looks built for a pruned H3 checkpoint: its AdaLN parts read a "
                            f"{found[0].width}-wide curve basis (e.g. {found[0].what!r}) where the full-size H3's AdaLN "
                            f"input is {found[0].model} wide; with the model it is refused unless --skip-parts "
                            f"{ADALN_PARTS}.")
        return plan, {}
    skipped = dict(Counter(p.kind for p in adaln_parts))
    if adaln_pairs:
        skipped = {LORA: len(adaln_pairs), **skipped}
    if skipped:
        warnings.append(f"{sum(skipped.values())} AdaLN parts of {name} are left out on request (--skip-parts "
                        f"{ADALN_PARTS}): {', '.join(f'{kind} {n}' for kind, n in skipped.items())}.")

    def keep(parts: PartsPlan) -> PartsPlan:
        return PartsPlan(tuple(p for p in parts.parts if not is_adaln(p.module)), parts.banks)

    return dataclasses.replace(
        plan, modules=tuple(m for m in plan.modules if not _adaln_module(m)),
        reference_modules=tuple(m for m in plan.reference_modules if not _adaln_module(m)),
        parts=keep(plan.parts), file_parts=keep(plan.file_parts)), skipped
