"""One adapter's settings, a frozen value that crosses module boundaries (the generation request is ``h3app.request``).

:class:`LoRASettings` is also the one schema of an adapter's settings: each field is declared once here, and the
per-adapter controls beyond alpha and scale (the *advanced strengths*) carry a :class:`Knob` in their field's
metadata that says how every surface shows them. The CLI's flags and ``--adapter-spec`` keys, the settings JSON
and its aliases, the API's parameters and labels, ``ADAPTERS_JSON_SCHEMA``, the snippets, the page's controls and
the history's words are derived from :data:`KNOBS` (docs/architecture.md, "Adding a setting"). The one JSON codec
is :meth:`LoRASettings.to_json` / :meth:`LoRASettings.from_json`; values are parsed once, when a settings value is
made from text, and travel as typed values after that (a schedule as a ``StrengthSchedule``, block ranges as a
``BlockStrength``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import H3AppError
from .rules import values
from .rules.blocks import BLOCKS_EXAMPLE, BlockStrength, parse_block_strength
from .rules.choices import LORA_MODES, MERGED, QKV_LAYOUTS, UNMERGED
from .rules.modality import ModalityStrength, parse_modality_strength
from .rules.schedule import SCHEDULE_EXAMPLE, StrengthSchedule, parse_schedule

FACTOR, SPELLING = "factor", "spelling"  # a knob's kind: a number (1: off) or a text spelling ("": none)


@dataclass(frozen=True)
class Knob:
    """How one advanced strength shows on every surface; its name is its ``LoRASettings`` field's."""

    key: str  # the short name: the ``--adapter-spec`` key and the settings JSON's alias ("audio")
    label: str  # the page's control ("Audio strength")
    words: str  # history and "what changed" ("audio strength")
    help: str  # one line for --help, the JSON schema and the API page
    info: str = ""  # the line under the page's control
    kind: str = FACTOR
    example: str = ""  # a value, as typed (a spelling's placeholder)
    bakes: bool = False  # ``export`` can bake it into a LoRA file (the others change per row or per evaluation)
    parse: Callable[[Any, str], Any] = parse_modality_strength  # text or a value → the value (a parsed one passes)
    name: str = ""  # filled from the field, as is its default
    default: Any = None

    @property
    def unset(self) -> Any:
        """What a control, a parameter or a record holds when the knob sets nothing: 1.0, or empty text."""
        return self.default if self.kind == FACTOR else ""

    @property
    def flag(self) -> str:
        """The command line's flag (``--audio-strength``)."""
        return "--" + self.name.replace("_", "-")

    def short(self, value: Any) -> str:
        """The value in a caption or a history label: ``audio ×0``, ``schedule linear:1:0.5``."""
        return f"{self.key} ×{float(value):.6g}" if self.kind == FACTOR else f"{self.key} {spelled(value)}"

    def shown(self, value: Any) -> str:
        """The value in a table of settings: ``0.5``, ``linear:1:0.5``; ``none`` for an empty spelling."""
        return f"{float(value):.6g}" if self.kind == FACTOR else spelled(value) or "none"

    def is_set(self, value: Any) -> bool:
        """The value changes something (a factor other than 1, a non-empty spelling)."""
        return float(value) != 1.0 if self.kind == FACTOR else bool(spelled(value))


def spelled(value: Any) -> str:
    """A knob's value as typed and stored in JSON: a number as ``%g``, a schedule or ranges by their label."""
    if isinstance(value, (StrengthSchedule, BlockStrength)):
        return value.label
    if isinstance(value, (int, float)) and not isinstance(value, bool):  # short, and exact when read back
        return f"{value:g}" if float(f"{value:g}") == value else repr(float(value))
    return "" if value is None else str(value)


def _knob(default: Any, knob: Knob) -> Any:
    return field(default=default, metadata={"knob": knob})


def _aliases(*names: str) -> Mapping[str, tuple[str, ...]]:
    return {"aliases": names}


def check_alpha(alpha: Any) -> float | None:
    """A user-given alpha: None (the alpha chain's value) or a finite number in (0, 1e6] (``rules.values``). A
    float already in range is kept as it is: text is parsed once, where it enters."""
    if alpha is None or (type(alpha) is float and values.ALPHA.holds(alpha)):
        return alpha
    return values.parse_alpha(alpha)


def check_strength(strength: Any, what: str = "scale") -> float:
    """A strength (``--scale``): finite, within ±100, may be negative (``rules.values``)."""
    if type(strength) is float and values.STRENGTH.holds(strength):
        return strength
    return values.parse_strength(strength, what)


@dataclass(frozen=True)
class LoRASettings:
    """Everything needed to apply one adapter: where it is, and how strongly.

    ``alpha=None`` means the alpha chain's resolved value per module; an explicit alpha replaces alpha only
    (an rsLoRA adapter stays rsLoRA). The effective scale per module is ``alpha * strength * group * block * step /
    rank`` (``rules.scale``); per-modality factors multiply each token row's delta (docs/lora-engine.md, "Advanced
    strength"). A modality factor other than 1 or a schedule in merged mode is refused here, in one line.
    """

    source: str = field(metadata=_aliases("path"))
    weight_name: str | None = field(default=None, metadata=_aliases("weight"))
    revision: str | None = field(default=None, metadata=_aliases("rev"))
    alpha: float | None = None
    strength: float = field(default=1.0, metadata=_aliases("scale"))
    mode: str = UNMERGED
    group_strengths: Mapping[str, float] = field(default_factory=dict)
    qkv_layout: str = "auto"
    skip_parts: tuple[str, ...] = ()  # part kinds left out (``adaln``: a pruned-base file's AdaLN parts)
    any_partition: bool = False  # apply a file made for the other transformer partition anyway
    # Advanced strength (docs/lora-engine.md): a factor per modality's rows, a schedule over the evaluations, a factor
    # per main block. Each field's Knob is how the CLI, the API, the JSON, the page and the snippets show it.
    video_strength: float = _knob(1.0, Knob(
        "video", "Video strength", "video strength", "factor of the adapter's delta on video rows (default 1; 0: "
        "the adapter changes nothing video rows compute directly; unmerged)",
        "× on the adapter's delta of every video row"))
    text_strength: float = _knob(1.0, Knob(
        "text", "Text", "text strength", "factor of the adapter's delta on text rows (default 1; unmerged)"))
    audio_strength: float = _knob(1.0, Knob(
        "audio", "Audio strength", "audio strength", "factor of the adapter's delta on audio rows (default 1; 0: "
        "keep the style, leave what audio rows compute; unmerged)",
        "0: keep the style, leave what audio rows compute"))
    strength_schedule: StrengthSchedule | None = _knob(None, Knob(
        "schedule", "Strength over the steps", "strength schedule", f"a factor per evaluation: one per evaluation "
        f"or a curve with @FROM-TO fractions (outside them: off), e.g. {SCHEDULE_EXAMPLE}; unmerged",
        "one factor per evaluation, or a curve with @from-to fractions", SPELLING, SCHEDULE_EXAMPLE,
        parse=parse_schedule))
    block_strength: BlockStrength = _knob(BlockStrength(), Knob(
        "blocks", "Per-block strength", "block strength", f"a factor per main block, × the group strengths, e.g. "
        f"{BLOCKS_EXAMPLE}", "× the group strengths of these main blocks", SPELLING, BLOCKS_EXAMPLE, bakes=True,
        parse=parse_block_strength))

    def __post_init__(self) -> None:
        source = os.fspath(self.source) if isinstance(self.source, os.PathLike) else self.source
        if not isinstance(source, str):  # an empty one is refused where sources are parsed ("SOURCE is empty")
            raise H3AppError(f"the adapter source must be a Hub repo id, an HF URL or a local path, got "
                             f"{values.short(source)}.")
        object.__setattr__(self, "source", values.check_length(source, "the adapter source"))
        for name in ("weight_name", "revision"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise H3AppError(f"{name} must be text, got {values.short(value)}.")
            if value is not None:
                values.check_length(value, name)
        object.__setattr__(self, "alpha", check_alpha(self.alpha))
        object.__setattr__(self, "strength", check_strength(self.strength))
        object.__setattr__(self, "group_strengths", {
            group: check_strength(value, what=f"strength of group {group!r}")
            for group, value in dict(self.group_strengths).items()})
        if self.mode not in LORA_MODES:
            raise H3AppError(f"mode must be one of {', '.join(LORA_MODES)}, got {self.mode!r}.")
        if self.qkv_layout not in QKV_LAYOUTS:
            raise H3AppError(f"qkv_layout must be one of {', '.join(QKV_LAYOUTS)}, got {self.qkv_layout!r}.")
        skip = (self.skip_parts,) if isinstance(self.skip_parts, str) else self.skip_parts
        if not all(isinstance(kind, str) for kind in skip):
            raise H3AppError(f"skip_parts must be part kinds such as 'adaln', got {values.short(self.skip_parts)}.")
        object.__setattr__(self, "skip_parts", tuple(sorted({kind.strip().lower() for kind in skip if kind.strip()})))
        object.__setattr__(self, "any_partition", bool(self.any_partition))
        for knob in KNOBS:  # text is parsed here, once; a parsed value passes through
            object.__setattr__(self, knob.name, knob.parse(getattr(self, knob.name), knob.words))
        refusal = merged_refusal(self.modality, self.strength_schedule) if self.mode == MERGED else None
        if refusal:
            raise H3AppError(refusal)

    @property
    def modality(self) -> ModalityStrength:
        """The factor of each modality's rows (video, text, audio)."""
        return ModalityStrength(self.video_strength, self.text_strength, self.audio_strength)

    @property
    def schedule(self) -> StrengthSchedule | None:
        """The strength schedule over a run's evaluations (parsed when these settings were made), None: none."""
        return self.strength_schedule

    @property
    def blocks(self) -> BlockStrength:
        """The factor per main block."""
        return self.block_strength

    def to_json(self) -> dict[str, Any]:
        """The settings JSON (what the session, ``/set_lora``, a run's record and a settings file hold); every
        advanced strength as it is typed (a factor as a number, a schedule or ranges by their canonical label)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data.update(group_strengths=dict(self.group_strengths), skip_parts=list(self.skip_parts))
        data.update(self.advanced_json())
        return data

    def advanced_json(self) -> dict[str, Any]:
        """The advanced strengths alone, as :meth:`to_json` writes them."""
        return {k.name: (getattr(self, k.name) if k.kind == FACTOR else spelled(getattr(self, k.name))) for k in KNOBS}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LoRASettings:
        """Settings from a JSON object with field names or their aliases (``scale``, ``weight``, ``rev``, ``path``,
        the knobs' keys); other keys (a run's provenance: sha256, commit, resolved_alpha …) are ignored. Every
        value is checked as the constructor checks it (one line)."""
        if not isinstance(data, Mapping):
            raise H3AppError(f"adapter settings must be a JSON object such as {{\"source\": \"owner/repo\"}}, "
                             f"got {values.short(data)}.")
        given = {ALIASES[key]: value for key, value in data.items() if key in ALIASES}
        source = given.get("source")
        if not isinstance(source, str) or not source.strip():
            raise H3AppError("adapter settings need a \"source\": a Hub repo id, an HF URL or a local path.")
        given["source"] = source.strip()
        for name in ("weight_name", "revision"):
            if given.get(name) in ("", None):
                given[name] = None
        return cls(**given)


def recorded(data: Mapping[str, Any]) -> dict[Knob, Any]:
    """The advanced strengths of a settings JSON object or a run's record as recorded there (numbers, canonical
    spellings; a knob not recorded: its default), read without parsing: the values were parsed when the settings
    were made, and the record spells them as :meth:`LoRASettings.to_json` did."""
    return {k: data.get(k.name, k.unset) for k in KNOBS}


def merged_refusal(modality: ModalityStrength, schedule: StrengthSchedule | None) -> str | None:
    """Why merged mode cannot run these advanced strengths (one line), None when it can: a merge bakes one
    strength into every row of a weight for every evaluation."""
    if not modality.is_unit:
        return (f"merged mode bakes one strength into the weights, for every modality: per-modality strength "
                f"({modality.label}) needs --lora-mode unmerged.")
    if schedule is not None:
        return (f"merged mode bakes one strength into the weights, for every evaluation: a strength schedule "
                f"({schedule.label}) needs --lora-mode unmerged.")
    return None


def _knobs() -> tuple[Knob, ...]:
    return tuple(dataclasses.replace(f.metadata["knob"], name=f.name, default=f.default)
                 for f in dataclasses.fields(LoRASettings) if "knob" in f.metadata)


KNOBS = _knobs()  # the advanced strengths, in the order every surface lists them
VIDEO, TEXT, AUDIO, SCHEDULE, BLOCKS = KNOBS
ADVANCED_FIELDS = tuple(k.name for k in KNOBS)
_KNOB_NAMES = frozenset(ADVANCED_FIELDS)
SETTINGS_FIELDS = tuple(f.name for f in dataclasses.fields(LoRASettings))
# Every name a settings JSON object may use: the field names, their aliases, the knobs' short keys.
ALIASES: dict[str, str] = {
    **{name: name for name in SETTINGS_FIELDS},
    **{alias: f.name for f in dataclasses.fields(LoRASettings) for alias in f.metadata.get("aliases", ())},
    **{k.key: k.name for k in KNOBS},
}
