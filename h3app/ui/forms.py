"""Event forms: what an event reads and what it shows, as small frozen dataclasses.

Gradio hands an event registered with a *set* of inputs one dict ``{component: value}`` and accepts a dict
``{component: value}`` back (components left out keep their value). The app turns those dicts into forms at the
edge with :func:`read` and views back into dicts with :func:`write`, matching form fields to components **by
name**, so adding a control never shifts another one. Event functions take and return forms only and are called
directly in tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar, cast

import gradio as gr

from ..errors import H3AppError
from ..request import GenerationRequest
from ..rules.check_pair import DEFAULT_A, DEFAULT_B
from ..rules.choices import FIRST_BLOCK_CACHE, FL2VA, NO_CACHE, REF2VA, T2VA, UNMERGED
from ..rules.request_defaults import SEED, TINY_DEFAULTS
from ..rules.values import SCALE_SLIDER, parse_alpha, parse_number, parse_strength
from ..settings import LoRASettings
from .adapter.advanced_strength import AdvancedForm
from .session import Session

SCALE_RANGE = (SCALE_SLIDER.low, SCALE_SLIDER.high)  # the Scale slider's ends: those of the rule that checks it

Form = TypeVar("Form")


class _Keep:
    """The value of a view field whose component keeps what it shows."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP: Any = _Keep()


def parts(container: Any, names: Sequence[str]) -> dict[str, Any]:
    """``{name: container.name}`` for the components a form or view names."""
    return {name: getattr(container, name) for name in names}


def field_names(form_type: type) -> list[str]:
    return [f.name for f in fields(form_type)]


def read(form_type: type[Form], components: Mapping[str, Any], values: Mapping[Any, Any], **given: Any) -> Form:
    """A ``form_type`` from Gradio's ``{component: value}``; ``components`` names the component of each field,
    ``given`` fills the others. A field whose metadata names a ``nested`` form (a slot's advanced strengths) is
    that form, made from the components named by its controls."""
    read_values: dict[str, Any] = {}
    known: set[str] = set()  # the names this form reads: its fields, and its nested forms' controls
    for each in fields(form_type):  # type: ignore[arg-type]  # a dataclass form
        kind = each.metadata.get("nested")
        known.update(kind.CONTROLS if kind is not None else (each.name,))
        if kind is None and each.name in components:
            read_values[each.name] = values[components[each.name]]
        elif kind is not None and each.name not in given:
            controls = {name: values[c] for name, c in components.items() if name in kind.CONTROLS}
            if controls:
                read_values[each.name] = kind(**controls)
    unknown = sorted(set(components) - known)
    if unknown:  # a component named for no field: a wiring mistake, said at once
        raise TypeError(f"{form_type.__name__} has no field or control {unknown[0]!r}")
    return form_type(**read_values, **given)


def write(view: Any, components: Mapping[str, Any]) -> dict[Any, Any]:
    """Gradio's ``{component: value}`` from a view: every field named in ``components`` that is not KEEP
    (``gr.skip()`` when that leaves nothing: Gradio reads an empty dict as one output's value)."""
    shown = {component: getattr(view, name) for name, component in components.items()
             if getattr(view, name) is not KEEP}
    return shown or gr.skip()


# ---------------------------------------------------------------------------------------------------- request
def optional_number(value: Any, what: str) -> float | None:
    """Empty number boxes (None) and 0 mean "the model's default"."""
    if value is None or value == "":
        return None
    number = parse_number(value, what)
    return None if number == 0 else number


@dataclass(frozen=True)
class RequestForm:
    """The request controls shared by Generate, Equivalence and Grid."""

    workflow: str = T2VA
    prompt: str = ""
    seed: Any = TINY_DEFAULTS.seed  # the app fills every field from its controls (the held model's defaults)
    randomize: bool = False
    steps: Any = TINY_DEFAULTS.steps
    duration: Any = TINY_DEFAULTS.duration
    height: Any = None
    width: Any = None
    shift: Any = None
    audio_shift: Any = None
    first_frame: str | None = None
    last_frame: str | None = None
    references: Sequence[Any] | None = ()
    cache: bool = False  # the step cache (diffusers' first-block cache, ``--cache fbc``); off by default

    def to_request(self, seed: int | None = None, *, lenient: bool = True) -> GenerationRequest:
        """A GenerationRequest (``seed`` replaces the form's). ``lenient``: inputs of another workflow are
        ignored (they stay in the form when the user switches workflow) instead of refused."""
        workflow = self.workflow or T2VA
        first, last = self.first_frame, self.last_frame
        refs = tuple(str(getattr(r, "name", r)) for r in (self.references or ()) if r)
        if lenient:
            if workflow != FL2VA:
                first = last = None
            if workflow != REF2VA:
                refs = ()
        # numbers reach the request as typed: GenerationRequest refuses a 7.5 seed or side, never rounds it; an
        # emptied seed box: the default seed
        height = cast("int | None", optional_number(self.height, "height"))
        width = cast("int | None", optional_number(self.width, "width"))
        used_seed = (SEED if self.seed in (None, "") else self.seed) if seed is None else int(seed)
        return GenerationRequest(
            prompt=self.prompt or "", seed=used_seed, steps=self.steps,  # 2.5 is refused
            duration=parse_number(self.duration, "duration"),
            height=height, width=width,
            shift=optional_number(self.shift, "shift"), audio_shift=optional_number(self.audio_shift, "audio shift"),
            workflow=workflow, first_frame=first or None, last_frame=last or None, references=refs,
            cache=FIRST_BLOCK_CACHE if self.cache else NO_CACHE)


REQUEST_FIELDS = field_names(RequestForm)


# ------------------------------------------------------------------------------------------------------ slots
@dataclass(frozen=True)
class SlotForm:
    """One adapter slot's controls. ``uploaded``: the slot's last upload, ``{"shown": "upload: name.safetensors",
    "path": <its server path>}`` (kept in session state; the source box shows only ``shown``)."""

    source: str | None = ""
    weight: str | None = None
    revision: str | None = ""
    override: bool = False
    alpha: Any = None
    strength: Any = 1.0
    qkv_layout: str = "auto"
    uploaded: Mapping[str, str] | None = None
    refused: str | None = None  # what Inspect answered for this source: a job would be refused the same way
    info: Mapping[str, Any] | None = None  # what Inspect showed for this source (its alpha chain fills the box)
    # "Advanced strength" (ui/adapter/advanced_strength.py): its controls, by the settings' field names
    advanced: AdvancedForm = field(default_factory=AdvancedForm, metadata={"nested": AdvancedForm})

    @property
    def source_to_read(self) -> str:
        """The source to read: the upload's server path while the box shows its label, else the box as typed."""
        text = source_text(self.source)
        if self.uploaded and text and text == self.uploaded.get("shown"):
            return self.uploaded["path"]
        return text

    def strength_value(self) -> float:
        """The Scale control's value: a strength every entry point accepts (``parse_strength``, the same line as
        the API's and the CLI's), and within the slider's narrower range (``rules.values.SCALE_SLIDER``); else
        refused in one line, never clamped."""
        return SCALE_SLIDER.check(parse_strength(self.strength), "scale")

    @property
    def alpha_text(self) -> str:
        """The alpha box as text, stripped (a number 0 stays "0"; only nothing is empty)."""
        return str(self.alpha if self.alpha is not None else "").strip()

    @property
    def typed_alpha(self) -> bool:
        """The alpha box holds something other than what Inspect put there (the file's own alpha, or nothing):
        a typed or pasted alpha — an override whether or not the Override tick has reached the page yet."""
        text = self.alpha_text
        if not text:
            return False
        shown = chain_text(self.info)
        try:
            return not shown or float(text) != float(shown)
        except ValueError:
            return True  # not a number: the override that parse_alpha refuses in one line

    @property
    def tick_for_box(self) -> bool | None:
        """What the Override tick becomes when the alpha box changes: ticked for a typed alpha, unticked for an
        emptied box, None (left as it is) for the file's own alpha. Decided by the box alone: the tick an event
        reads can be older than the box (an earlier answer not yet on the page), and deciding from it once left
        Override ticked over an emptied box on a loaded server."""
        if self.typed_alpha:
            return True
        return False if not self.alpha_text else None

    @property
    def overrides(self) -> bool:
        """Override is ticked, or the alpha box holds a typed alpha."""
        return bool(self.override) or self.typed_alpha

    def alpha_value(self) -> float | None:
        """None (auto: the alpha chain per module) unless the panel overrides it (:attr:`overrides`); then a
        finite alpha > 0 (the alpha box is text, so that an empty box reads as empty rather than 0)."""
        return alpha_from_controls(self.overrides, self.alpha)

    def settings(self, mode: str | None) -> LoRASettings | None:
        """The slot's adapter settings; None when the source box is empty (no adapter in this slot)."""
        if not self.source_to_read:
            return None
        if self.refused:
            raise H3AppError(self.refused)
        return LoRASettings(source=self.source_to_read, weight_name=self.weight or None,
                            revision=(self.revision or "").strip() or None, alpha=self.alpha_value(),
                            strength=self.strength_value(), mode=mode or UNMERGED,
                            qkv_layout=self.qkv_layout or "auto", **self.advanced.fields())


SLOT_FIELDS = [*(name for name in field_names(SlotForm) if name != "advanced"), *AdvancedForm.CONTROLS]


def source_text(value: Any) -> str:
    """The source box's text as the slot compares it: stripped, empty for nothing."""
    return str(value or "").strip()


def chain_text(info: Mapping[str, Any] | None) -> str:
    """What the alpha box shows for a file when nothing overrides it: its one alpha, else empty."""
    alpha = (info or {}).get("alpha")
    return "" if alpha is None else f"{float(alpha):g}"


def alpha_from_controls(override: bool, alpha: Any) -> float | None:
    """The alpha the panel asks for: None unless Override is ticked (then the box must hold one)."""
    if not override:
        return None
    if alpha is None or (isinstance(alpha, str) and not alpha.strip()):
        raise H3AppError("Override alpha is ticked but no alpha is given: type one (e.g. 8) or untick Override.")
    return parse_alpha(alpha)


@dataclass(frozen=True)
class SyncForm:
    """What a job reads from the panel right before it runs: the session, the LoRA mode and each slot."""

    session: Session | None
    mode: str
    slots: Mapping[str, SlotForm] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------------- jobs
@dataclass(frozen=True)
class JobForm:
    """A GPU job's common inputs: the session (its adapters and history), LoRA mode, HF token and the request."""

    session: Session | None
    mode: str | None
    request: RequestForm
    token: str | None = None


@dataclass(frozen=True)
class CheckForm:
    """The Equivalence tab's two settings: A and B (alpha: a number, or empty/auto)."""

    a_alpha: Any = DEFAULT_A.alpha
    a_scale: Any = DEFAULT_A.strength
    b_alpha: Any = DEFAULT_B.alpha
    b_scale: Any = DEFAULT_B.strength


@dataclass(frozen=True)
class GridForm:
    """The Grid tab's axes as typed: comma-separated alphas (``auto`` allowed), scales and seeds; ``rows``: adapters
    as rows (``SOURCE`` or ``SOURCE,weight=GLOB``; empty: adapter 1 over the alphas)."""

    alphas: str = TINY_DEFAULTS.grid.alphas
    scales: str = TINY_DEFAULTS.grid.scales
    seeds: str = TINY_DEFAULTS.grid.seeds
    rows: Any = ()
