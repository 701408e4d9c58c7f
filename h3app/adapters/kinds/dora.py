"""DoRA beside an A/B pair (PEFT ``lora_magnitude_vector``, kohya/LyCORIS ``dora_scale``): the key names of its
magnitude and the checks on its shape from the header alone. The rule it runs by (PEFT's, which diffusers loads and
onto which diffusers' own converter maps ``dora_scale``) lives with the engine, ``h3app.lora.dora``; the magnitude's
rows follow ``lora_B``'s through normalisation (thirds of a fused QKV, halves of a SwiGLU ``fc1`` swapped)."""

from __future__ import annotations

from ...errors import H3AppError
from ..factor_checks import FLOAT_DTYPES, FactorFacts
from ..types import HeaderView

LABEL = "DoRA"
# A magnitude key's last part(s): PEFT's ``lora_magnitude_vector`` (optionally with its adapter slot and
# ``.weight``), or kohya/LyCORIS's ``dora_scale``.
MAGNITUDE_NAMES = r"lora_magnitude_vector(?:\.[A-Za-z0-9_\-]+)?(?:\.weight)?|dora_scale"


def check_magnitude(view: HeaderView, stem: str, key: str, facts: FactorFacts) -> None:
    """Refuse a DoRA magnitude that is not one float per output row of its module (``[out]``, PEFT; ``[out, 1]``,
    kohya/LyCORIS ``dora_scale`` decomposed on the output axis) or sits on stacked factors."""
    dtype, shape = view.tensors[key]
    rows = sum(out_features for out_features, _ in facts.target_shapes)
    if dtype not in FLOAT_DTYPES:
        raise H3AppError(f"{view.name}: {key!r} is {dtype}: a quantised or integer DoRA magnitude is not supported; "
                         "use an F16/BF16/F32 file.")
    if facts.stacked:
        raise H3AppError(f"{view.name}: module {stem!r} has a DoRA magnitude on stacked 3D factors: store the fused "
                         "QKV's factors 2D (one lora_A, lora_B rows [q; k; v]).")
    if len(shape) == 2 and shape[0] == 1 and shape[1] != 1:
        raise H3AppError(f"{view.name}: {key!r} is {list(shape)}: a DoRA decomposed on the input axis (LyCORIS "
                         "wd_on_out=False), which PEFT and diffusers cannot express; h3app applies output-axis DoRA "
                         "only — retrain with wd_on_out, or use a LoRA.")
    if tuple(shape) not in ((rows,), (rows, 1)):
        raise H3AppError(f"{view.name}: {key!r} is {list(shape)} but module {stem!r} has {rows} output rows: a DoRA "
                         "magnitude holds one value per output row; the file is damaged or for another model.")
