"""One guard around every event of the app (UI and API alike), installed on the built Blocks (``guard_events``).

- **Text bounded first**: before the event's own code runs, every text input of a named endpoint is at most its
  field's length (``FIELD_CHARS`` by parameter name, ``rules.values.MAX_FIELD_CHARS`` for the other named ones):
  one line naming the field and the limit, the text never echoed. The page's own (private) events bound every text
  at ``MAX_TEXT_CHARS`` only, so that a field a little too long is refused by its own rule in its own place (a
  source ≤ 4,096 characters in the inspect card) rather than as an error badge on whatever cheap event read it; the
  parsers check their fields again (a source or revision ≤ 4,096 characters, a weight-name part ≤ 255).
- **Hosted answers hold no internals**: a user error keeps its one line, with server folders turned back into
  the names a visitor knows (``Redactor``); any other exception becomes the generic line with an error id
  (``errors.for_visitor``: the details go to the server log). JSON and HTML outputs are redacted the same way, after
  the one rule for local paths in results (``backend.outputs.names_only``: file names, never folders).
"""

from __future__ import annotations

import functools
import inspect
import os
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr
from gradio_client.utils import is_file_obj_with_meta

from ...backend.outputs import MAX_DEPTH, names_only
from ...errors import H3AppError, for_visitor
from ...hosting.admission import InFlight, Refused
from ...hosting.upload_policy import UPLOAD_PREFIX
from ...hosting.visitors import visitor_keys
from ...rules.prompt import MAX_PROMPT_CHARS
from ...rules.values import MAX_FIELD_CHARS, check_length
from ..gradio_compat import EventFunction, current_request, wrap_events

if TYPE_CHECKING:
    from ...backend.service import Backend

ADAPTERS_JSON_CHARS = 8 * MAX_FIELD_CHARS  # two adapters' source, weight name and revision, with room for keys
FIELD_CHARS = {"prompt": MAX_PROMPT_CHARS, "adapters_json": ADAPTERS_JSON_CHARS}
MAX_TEXT_CHARS = max(MAX_FIELD_CHARS, *FIELD_CHARS.values())
MAX_ITEMS = 1024  # values looked at in one input (a UI form's dict, a list of files): more is refused
REDACTED_OUTPUTS = (gr.JSON, gr.HTML, gr.Markdown)  # what answers show as text; values a form sends back are not


def check_inputs(fn: Callable[..., Any], args: tuple, kwargs: dict, by_field: bool = True) -> None:
    """Refuse (one ``gr.Error`` line) a text input longer than its field allows (``by_field``; else longer than
    ``MAX_TEXT_CHARS``), before ``fn`` runs."""
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
    except TypeError:
        bound = {f"input {i + 1}": value for i, value in enumerate(args)} | kwargs
    for name, value in bound.items():
        try:
            limit = FIELD_CHARS.get(name, MAX_FIELD_CHARS) if by_field else MAX_TEXT_CHARS
            _check_value(value, name.replace("_", " "), limit)
        except H3AppError as error:
            raise gr.Error(str(error), print_exception=False) from None


def _check_value(value: Any, what: str, limit: int, depth: int = 0) -> None:
    if isinstance(value, str):
        check_length(value, what, limit)
    elif isinstance(value, (dict, list, tuple)) and depth < 3:
        items = list(value.values() if isinstance(value, dict) else value)
        if len(items) > MAX_ITEMS:
            raise H3AppError(f"{what} has {len(items):,} values, more than the {MAX_ITEMS:,} allowed.")
        for item in items:  # a UI form's values are not named here: the largest field's bound
            _check_value(item, what if depth == 0 and not isinstance(value, dict) else "a text field",
                         limit if not isinstance(value, dict) else MAX_TEXT_CHARS, depth + 1)


class Redactor:
    """Server folders in an answer, turned back into what a visitor knows: an upload as ``upload: name``, a file in
    an allowed folder (the demo adapters) by its path inside it, anything under the working folder relative to
    it, and the output folder, the Hub cache and the home folder as a word."""

    def __init__(self, backend: Backend) -> None:
        from huggingface_hub import constants

        rules: list[tuple[str, str]] = []
        uploads = backend.uploads_dir
        # Every allowed folder by the path inside it, the uploads folder too (an upload's own folder is "upload: ").
        folders: list[tuple[str | Path, str]] = [(f, "") for f in backend.policy.allowed_local_dirs]
        folders += [(os.getcwd(), ""), (backend.output_dir, "results/"),
                    (constants.HF_HUB_CACHE, "hub-cache/"), (os.path.expanduser("~"), "~/")]
        for folder, shown in folders:
            for spelling in _spellings(folder):
                rules.append((spelling, shown))
        self._uploads = [re.compile(re.escape(s) + "/" + UPLOAD_PREFIX + r"[0-9a-f]+/") for s in _spellings(uploads)]
        self._rules = sorted(rules, key=lambda rule: -len(rule[0]))  # the deepest folder first

    def text(self, text: str) -> str:
        for pattern in self._uploads:
            text = pattern.sub("upload: ", text)
        for folder, shown in self._rules:
            text = text.replace(folder + os.sep, shown).replace(folder, shown.rstrip("/") or ".")
        return text

    def value(self, value: Any) -> Any:
        """``value`` (text, or JSON-like lists and dicts of it) as a visitor sees it: local paths in results by file
        name (``names_only``), then server folders redacted."""
        return self._value(names_only(value))

    def _value(self, value: Any, depth: int = 0) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if depth > MAX_DEPTH or is_file_obj_with_meta(value):  # Gradio moves a file to its cache, sends that path
            return value
        if isinstance(value, dict):
            return {k: self._value(v, depth + 1) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._value(v, depth + 1) for v in value)
        return value


def _spellings(folder: Any) -> list[str]:
    """The ways ``folder`` can appear in text: as given made absolute, and with symlinks resolved."""
    if not folder:
        return []
    absolute = os.path.abspath(os.fspath(folder))
    spellings = {absolute.rstrip(os.sep), os.path.realpath(absolute).rstrip(os.sep)}
    return [s for s in spellings if s and s != os.sep]


def public_report(report: dict[str, Any], name: str) -> dict[str, Any]:
    """A match report as an answer shows it: named ``name`` (the file as the visitor gave it), without the cache key
    and file identity (path, size, mtime) the server keeps it under."""
    return {**{k: v for k, v in report.items() if k != "identity"}, "name": name}


def visitor_error(error: BaseException, redactor: Redactor | None, where: str) -> BaseException:
    """What a visitor sees of ``error``: a user error's line (redacted), else the generic line with an error id."""
    if redactor is None or not isinstance(error, Exception):
        return error
    if isinstance(error, gr.Error):
        error.message = redactor.text(str(error.message))
        return error
    return gr.Error(redactor.text(str(for_visitor(error, where))), print_exception=False)


def guarded(fn: Callable[..., Any], redactor: Redactor | None, redacted: Callable[[Any], Any], where: str,
            in_flight: InFlight | None = None, by_field: bool = True) -> Callable[..., Any]:
    """``fn`` with its inputs bounded (``check_inputs``), its errors (hosted: ``redactor`` given) as a visitor may
    see them and its answer passed through ``redacted``; with ``in_flight`` (an off-queue event in hosted mode) also
    at most a few running per visitor. A generator stays a generator."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stream(*args: Any, **kwargs: Any) -> Any:
            check_inputs(fn, args, kwargs, by_field)
            with _held(in_flight):
                try:
                    for item in fn(*args, **kwargs):
                        yield redacted(item)
                except Exception as error:
                    raise visitor_error(error, redactor, where) from None
        return stream

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        check_inputs(fn, args, kwargs, by_field)
        with _held(in_flight):
            try:
                return redacted(fn(*args, **kwargs))
            except Exception as error:
                raise visitor_error(error, redactor, where) from None
    return call


@contextmanager
def _held(in_flight: InFlight | None) -> Iterator[None]:
    """One of the calling visitor's off-queue requests, or a one-line refusal when it has too many running."""
    if in_flight is None:
        yield
        return
    keys = visitor_keys(current_request())
    try:
        in_flight.acquire(keys)
    except Refused as error:
        raise gr.Error(str(error), print_exception=False) from None
    try:
        yield
    finally:
        in_flight.release(keys)


def _answer_redactor(outputs: Iterable[Any], redactor: Redactor | None) -> Callable[[Any], Any]:
    """Redacts the parts of an event's answer that go to JSON/HTML/Markdown outputs (identity when none)."""
    outputs = list(outputs)
    shown = [isinstance(o, REDACTED_OUTPUTS) for o in outputs]
    if redactor is None or not any(shown):
        return lambda answer: answer

    def redacted(answer: Any) -> Any:
        if isinstance(answer, dict) and any(k in outputs for k in answer if not isinstance(k, str)):
            return {k: redactor.value(v) if isinstance(k, REDACTED_OUTPUTS) else v for k, v in answer.items()}
        if len(outputs) > 1 and isinstance(answer, (tuple, list)) and len(answer) == len(outputs):
            return type(answer)(redactor.value(v) if s else v for v, s in zip(answer, shown))
        return redactor.value(answer) if len(outputs) == 1 and shown[0] else answer
    return redacted


def guard_events(demo: gr.Blocks, backend: Backend) -> None:
    """Wrap every event function of ``demo`` (built for ``backend``) in :func:`guarded`; hosted mode also redacts."""
    redactor = Redactor(backend) if backend.hosted else None
    off_queue = InFlight() if backend.hosted else None

    def guard(event: EventFunction) -> Callable[..., Any]:
        where = f"event {event.api_name or getattr(event.fn, '__name__', 'event')}"
        return guarded(event.fn, redactor, _answer_redactor(event.outputs, redactor), where,
                       None if event.queued else off_queue, by_field=event.api_visibility != "private")

    wrap_events(demo, guard)


__all__ = ["FIELD_CHARS", "MAX_TEXT_CHARS", "Redactor", "check_inputs", "guard_events", "guarded", "public_report",
           "visitor_error"]
