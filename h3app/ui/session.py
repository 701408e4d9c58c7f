"""A browser (or gradio_client) session's own settings, and the job it is running.

A :class:`Session` lives in a ``gr.State`` (per session, deep-copied, so it holds only frozen values): ``adapters``
maps slot ``"1"``/``"2"`` to one adapter's :class:`LoRASettings` (what ``/load`` and ``/set_lora`` edit, what the
next job carries as it is, parsed once where it was typed — docs/architecture.md, decision 7) and ``history``
holds this session's results as :class:`HistoryEntry`.
Both are frozen: every change makes a new Session. Job handles hold threads and events, so they live in
:class:`RunningJobs`, keyed by the session hash, never in the State.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..errors import H3AppError
from ..rules.choices import LORA_MODES, QKV_LAYOUTS
from ..rules.values import ALPHA, MAX_FIELD_CHARS, STRENGTH
from ..settings import ALIASES, FACTOR, KNOBS, Knob, LoRASettings

SLOTS = ("1", "2")
MAX_HISTORY = 60

_TEXT = {"type": ["string", "null"], "maxLength": MAX_FIELD_CHARS}
_SCALE = {"type": "number", "minimum": STRENGTH.low, "maximum": STRENGTH.high}


def _aliases(name: str) -> str:
    """`` (alias: scale)``: the other names a settings JSON object may give field ``name`` (``settings.ALIASES``)."""
    others = [key for key, field_name in ALIASES.items() if field_name == name and key != name]
    return f" (alias: {', '.join(others)})" if others else ""


def _knob_schema(knob: Knob) -> dict[str, Any]:
    kind = {**_SCALE, "default": 1.0} if knob.kind == FACTOR else _TEXT
    return {**kind, "description": knob.help + _aliases(knob.name)}


ADAPTER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["source"],
    "properties": {
        "source": {"type": "string", "minLength": 1, "maxLength": MAX_FIELD_CHARS,
                   "description": "Hub repo id (owner/name), HF URL or local path" + _aliases("source")},
        "weight_name": {**_TEXT, "description": "the .safetensors file in the repo or folder; omit when there is "
                                                "only one" + _aliases("weight_name")},
        "revision": {**_TEXT, "description": "branch, tag or commit; default main" + _aliases("revision")},
        "alpha": {"description": "override alpha; \"auto\" or null: the file's own alpha per module",
                  "oneOf": [{"type": "number", "exclusiveMinimum": ALPHA.low, "maximum": ALPHA.high},
                            {"enum": ["auto", None]}]},
        "scale": {**_SCALE, "default": 1.0, "description": "strength; negative pushes the other way (alias: strength)"},
        "mode": {"enum": list(LORA_MODES), "default": LORA_MODES[0], "description": "one mode for every adapter of "
                                                                                   "a job"},
        "group_strengths": {"type": "object", "additionalProperties": _SCALE,
                            "description": "extra strength per module group (attention, feed_forward, …)"},
        "qkv_layout": {"enum": list(QKV_LAYOUTS), "default": QKV_LAYOUTS[0]},
        "skip_parts": {"type": "array", "items": {"type": "string"}, "description": "part kinds left out (adaln: "
                                                                                   "a pruned-base file's AdaLN parts)"},
        "any_partition": {"type": "boolean", "default": False, "description": "apply a file made for the other "
                                                                              "transformer partition anyway"},
        **{knob.name: _knob_schema(knob) for knob in KNOBS},
    },
}
ADAPTERS_JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema", "title": "adapters_json",
    "description": "empty text: the session's adapters; [] : no adapter; else one adapter or a list of them",
    "oneOf": [ADAPTER_SCHEMA, {"type": "array", "maxItems": len(SLOTS), "items": ADAPTER_SCHEMA}],
}
ADAPTERS_JSON_EXAMPLE = ('[{"source": "assets/adapters/tiny_turbo_4step.safetensors", "alpha": 8, '
                         '"scale": 0.125}]')


def adapters_json_words() -> str:
    """The schema in one line, for the API page (Gradio shows one docstring line per parameter)."""
    factors = ", ".join(f'"{k.name}"' for k in KNOBS if k.kind == FACTOR)
    spellings = ", ".join(f'"{k.name}": e.g. "{k.example.split(" · ")[0]}"' for k in KNOBS if k.kind != FACTOR)
    return (f'JSON text: empty = this session\'s adapters, [] = none, else an object or a list of at most '
            f'{len(SLOTS)} objects {{"source": Hub repo id, HF URL or local path (required); "weight_name", '
            f'"revision": text; "alpha": a number > {ALPHA.low:g} and at most {ALPHA.high:g}, or "auto" (the '
            f'file\'s own); "scale": {STRENGTH.low:g} to {STRENGTH.high:g} (default 1); "mode": '
            f'{" or ".join(LORA_MODES)}; advanced strengths {factors}: numbers (default 1), {spellings}}}; '
            f'e.g. {ADAPTERS_JSON_EXAMPLE}')


@dataclass(frozen=True)
class HistoryEntry:
    """One result of this session: its number (``#n``, from 1), what ran (``kind``: generate, check A/B/fallback,
    grid) and its label, the mp4, its thumbnail and hash, and the settings it ran with (the run's settings JSON)."""

    number: int
    kind: str
    label: str
    video: str
    thumbnail: str | None
    hash: str
    settings: dict[str, Any]

    @property
    def id(self) -> str:
        """``#n label``: the entry's name in the A/B pickers (unique within the session)."""
        return f"#{self.number} {self.label}".strip()


@dataclass(frozen=True)
class Session:
    """A session's adapters (slot → settings, as the next job carries them) and results, oldest first."""

    adapters: dict[str, LoRASettings] = field(default_factory=dict)
    history: tuple[HistoryEntry, ...] = ()

    def __hash__(self) -> int:  # Gradio tells a State's changes apart by hash: the content's, as for a dict
        return hash(json.dumps(self.to_json(), sort_keys=True, default=str))

    def to_json(self) -> dict[str, Any]:
        """The session as JSON: each slot's settings JSON (``LoRASettings.to_json``) and the history."""
        return {"adapters": self.adapters_json(), "history": [asdict(entry) for entry in self.history]}

    def adapters_json(self) -> dict[str, dict[str, Any]]:
        """Slot → settings JSON: what ``/load`` and ``/set_lora`` answer with."""
        return {slot: settings.to_json() for slot, settings in self.adapters.items()}

    def entry(self, entry_id: str | None) -> HistoryEntry | None:
        """The history entry named ``entry_id`` (its :attr:`HistoryEntry.id`), or None."""
        return next((h for h in self.history if h.id == entry_id), None)


def new_session() -> Session:
    """The value of a fresh session: no adapter, no history."""
    return Session()


def check_slot(slot: Any) -> str:
    """``1``/``"1"``/``1.0`` → ``"1"``; anything else is refused."""
    text = str(int(slot)) if isinstance(slot, (int, float)) and not isinstance(slot, bool) else str(slot).strip()
    if text not in SLOTS:
        raise H3AppError(f"adapter slot must be 1 or 2, got {slot!r}.")
    return text


def parse_adapters_json(text: str | None) -> list[LoRASettings] | None:
    """API clients without a session: ``None``/empty → None (use the session's adapters); ``"[]"`` → no adapter;
    a JSON object or list of objects → those adapters."""
    if text is None or not str(text).strip():
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise H3AppError(f"adapters must be JSON (a list of objects with \"source\", \"alpha\", \"scale\"): "
                         f"{error.msg} at character {error.pos}.") from None
    items = data if isinstance(data, list) else [data]
    if len(items) > len(SLOTS):
        raise H3AppError(f"at most {len(SLOTS)} adapters per job, got {len(items)}.")
    return [LoRASettings.from_json(item) for item in items]


def with_adapter(session: Session | None, slot: str, settings: LoRASettings | None) -> Session:
    """``session`` with ``slot`` set to ``settings`` (None removes it)."""
    session = session or new_session()
    adapters = {name: held for name, held in session.adapters.items() if name != slot}
    if settings is not None:
        adapters[slot] = settings
    return replace(session, adapters=adapters)


def job_adapters(session: Session | None, mode: str | None = None) -> list[LoRASettings]:
    """The session's adapters in slot order, as the next job will carry them (``mode`` overrides each one's)."""
    held = (session or new_session()).adapters
    adapters = [held[slot] for slot in SLOTS if slot in held]
    return [replace(a, mode=mode) if mode is not None and a.mode != mode else a for a in adapters]


def add_history(session: Session | None, *, kind: str, label: str, video: str, thumbnail: str | None, hash: str,
                settings: Mapping[str, Any]) -> Session:
    """``session`` with one more result (numbered ``#n``, after the newest); the oldest drop past MAX_HISTORY."""
    session = session or new_session()
    number = session.history[-1].number + 1 if session.history else 1
    entry = HistoryEntry(number, kind, label, str(video), thumbnail and str(thumbnail), hash, dict(settings))
    return replace(session, history=(*session.history, entry)[-MAX_HISTORY:])


class RunningJobs:
    """The job each session is running, so that its Cancel button can stop it (thread-safe). A job clicked but
    still waiting in Gradio's queue is *expected*: a Cancel meanwhile stops it before it starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: dict[str, Any] = {}
        self._expected: dict[str, bool] = {}  # session → cancelled while waiting

    def expect(self, key: str) -> None:
        """A job of ``key`` was clicked and waits for the GPU queue."""
        with self._lock:
            self._expected[key] = False

    def start(self, key: str) -> bool:
        """The expected job of ``key`` starts; True when it was cancelled while it waited."""
        with self._lock:
            return self._expected.pop(key, False)

    @contextmanager
    def track(self, key: str, handle: Any) -> Iterator[Any]:
        """Remember ``handle`` as ``key``'s current job while the block runs."""
        with self._lock:
            self._handles[key] = handle
        try:
            yield handle
        finally:
            with self._lock:
                if self._handles.get(key) is handle:
                    del self._handles[key]

    def set(self, key: str, handle: Any) -> None:
        """Make ``handle`` ``key``'s current job (for jobs whose handle appears only once they run)."""
        with self._lock:
            self._handles[key] = handle

    def clear(self, key: str, handle: Any = None) -> None:
        """Forget ``key``'s job (only if it is still ``handle``, when given)."""
        with self._lock:
            if handle is None or self._handles.get(key) is handle:
                self._handles.pop(key, None)

    def cancel(self, key: str) -> str | None:
        """Ask ``key``'s current job to stop at its next step; returns its label, or None when it runs none."""
        with self._lock:
            handle = self._handles.get(key)
            if handle is None and key in self._expected:
                self._expected[key] = True
                return "queued job"
        if handle is None:
            return None
        handle.cancel()
        return handle.label

    def current(self, key: str) -> Any:
        with self._lock:
            return self._handles.get(key)


