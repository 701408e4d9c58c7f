"""Queue-less "redraw on change" events: at most one per trigger, answered in the order they were sent.

Gradio 6.31's page defers an ``always_last`` event that is triggered again while it runs, and when the run ends
it re-sends the *trigger* to every event listening on it, not only to the deferred one. Two such events on one
trigger then defer and restart each other for as long as their runs overlap: the page posts requests a few
times a second until it is closed (seen: one Override tick re-running the readout, the line above Generate and
the check's pair every 0.45 s, and a note that never settled on a loaded machine).

So the panel's cheap listeners register here (:meth:`ChangeEvents.on`) and :meth:`ChangeEvents.wire` makes
*one* event per trigger that runs that trigger's listeners in the order they registered and returns their
outputs together. A listener sees exactly the inputs it asked for, as Gradio would pass them: a list of
components → positional arguments, a set → one ``{component: value}`` dict.

Events of *different* triggers still run side by side, and their answers land in whatever order their runs end:
on a loaded server a box's late note could cover the note of a box typed after it, and a late "Source changed"
clear could cover Inspect's card. So every such answer passes :class:`AnswerOrder` (``ChangeEvents.listen``):
per page, each output keeps the answer of the newest event that wrote it, "newest" meaning the one the page sent
last, with the values it held then. The page numbers its events itself as they leave it (:data:`SENT_JS`, Gradio's
public ``js=`` hook: a counter of the page written into a hidden first input), because the order they reach the
server is not the order they were sent (two requests race over two connections, and a queue-less request is read
before it is numbered there); a call without the page's number (a client without the page's script) is ordered by
its arrival (``gradio_compat.sent_order``). An older answer leaves that output alone.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from ..lru import LRU
from .gradio_compat import current_request, sent_order

# Off the queue, no spinner, not in the API: a redraw of text or plots from the controls, milliseconds.
CHEAP: dict[str, Any] = {"queue": False, "show_progress": "hidden", "api_visibility": "private"}
# The page's own count of the ordered events it sent, written into the event's first input as it leaves the page
# (Gradio runs an event's ``js`` before sending and sends what it returns as the inputs; it receives the inputs'
# values and then the outputs').
SENT_JS = "(...values) => [(window.h3SentEvents = (window.h3SentEvents || 0) + 1), ...values.slice(1, {inputs})]"


@dataclass(frozen=True)
class Listener:
    """One redraw: ``fn`` of ``inputs`` (positional, or one dict when ``keyed``) writing ``outputs``."""

    fn: Callable[..., Any]
    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]
    keyed: bool

    @classmethod
    def of(cls, fn: Callable[..., Any], inputs: Any, outputs: Any) -> Listener:
        keyed = isinstance(inputs, (set, frozenset))
        return cls(fn, tuple(inputs), tuple(outputs) if isinstance(outputs, (list, tuple)) else (outputs,), keyed)

    def __call__(self, values: Mapping[Any, Any]) -> dict[Any, Any]:
        """Its outputs as ``{component: value or update}`` (components it leaves out keep their value)."""
        if self.keyed:
            result = self.fn({component: values[component] for component in self.inputs})
        else:
            result = self.fn(*(values[component] for component in self.inputs))
        if isinstance(result, dict) and all(key in self.outputs for key in result):
            return result  # keyed by component (``write``); {} changes nothing
        if len(self.outputs) == 1:
            return {self.outputs[0]: result}  # one output: a value, or an update such as ``gr.skip()``
        return dict(zip(self.outputs, result, strict=True))


@dataclass
class _Group:
    trigger: Any
    listeners: list[Listener] = field(default_factory=list)
    then: list[Listener] = field(default_factory=list)


def _skips(value: Any) -> bool:
    """``gr.skip()``: an update that changes nothing (it writes no value, so it claims no output)."""
    return isinstance(value, dict) and value == {"__type__": "update"}


@dataclass(frozen=True)
class Written:
    """Who wrote an output last: its event's ``order``, what the answer was ``about`` (the text it answers for,
    None: no one thing) and whether it was a ``placeholder`` (only "this changed, not answered yet")."""

    order: int
    about: str | None = None
    placeholder: bool = False

    def covers(self, order: int, about: str | None, placeholder: bool) -> bool:
        """This write stays over an answer of ``order`` about ``about``: newer, unless the two are about one thing
        and this one is only the placeholder (a real answer about the same thing replaces it, whatever the order:
        the page may send a pasted text's Enter before its input event); a placeholder never covers, nor replaces,
        a real answer about the same thing."""
        if about is not None and about == self.about and placeholder != self.placeholder:
            return not self.placeholder
        return self.order > order


class AnswerOrder:
    """Which event's answer each output of each page shows: an answer older than one already written to an output
    leaves that output alone (the newer answer was computed from what the page held later)."""

    def __init__(self, pages: int = 4096) -> None:
        self._written: LRU[str, dict[int, Written]] = LRU(pages)  # page → {id(output): its last writer}
        self._lock = threading.Lock()

    def kept(self, answer: Any, page: str | None, order: int | None, about: str | None = None,
             placeholder: bool = False) -> Any:
        """``answer`` (``{component: value}``) less the outputs another answer of ``page`` covers
        (:meth:`Written.covers`), recording this one for the rest; ``gr.skip()`` when nothing is left. Anything
        else — a plain value or update (a dict keyed by text), no page or no order (a direct call) — passes."""
        if not page or order is None or not isinstance(answer, dict) or not answer \
                or any(isinstance(key, str) for key in answer):
            return answer
        with self._lock:
            written = self._written.get(page)
            if written is None:
                written = {}
                self._written.put(page, written)
            kept = {}
            for output, value in answer.items():
                last = written.get(id(output))
                if last is not None and last.covers(order, about, placeholder):
                    continue  # a newer answer, or a real one about the same thing, is on the page already
                if not _skips(value):
                    written[id(output)] = Written(max(order, last.order if last else 0), about, placeholder)
                kept[output] = value
        return kept or gr.skip()

    def ordered(self, fn: Callable[..., Any], inputs: Any, about: Callable[[dict[Any, Any]], str] | None = None,
                placeholder: bool = False) -> tuple[Callable[..., Any], list[Any]]:
        """``fn`` of ``inputs`` (a list: positional; a set: one ``{component: value}`` dict, as Gradio passes them)
        as an event function of ``[stamp, *inputs]`` whose answer passes :meth:`kept` for the running event's page,
        in the order the page numbered it (``stamp``'s value; the arrival order when it carries none), ``about``
        what ``about`` says of the inputs' values. Returns the function and the inputs it takes after the stamp;
        Gradio sees ``fn``'s special parameters (a request, a progress tracker) too."""
        components = list(inputs) if isinstance(inputs, (list, tuple, set, frozenset)) else [inputs]
        keyed = isinstance(inputs, (set, frozenset))
        given = list(inspect.signature(fn).parameters.values())
        special = given[1 if keyed else len(components):]  # after the inputs' values: gr.Request, gr.Progress
        positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
        each = [inspect.Parameter(f"input_{i}", positional) for i in range(len(components))]
        shown = inspect.Signature([inspect.Parameter("sent", positional), *each, *special])

        @functools.wraps(fn)
        def answer(*args: Any, **kwargs: Any) -> Any:
            bound = shown.bind(*args, **kwargs).arguments
            values = [bound[p.name] for p in each]
            rest = {p.name: bound[p.name] for p in special if p.name in bound}
            by_component = dict(zip(components, values, strict=True))
            result = fn(by_component, **rest) if keyed else fn(*values, **rest)
            sent = bound["sent"]
            order = int(sent) if isinstance(sent, (int, float)) and sent > 0 else sent_order()
            return self.kept(result, getattr(current_request(), "session_hash", None), order,
                             about(by_component) if about is not None else None, placeholder)

        answer.__signature__ = shown  # type: ignore[attr-defined]  # what Gradio reads for its special arguments
        return answer, components


def _union(components: Sequence[Sequence[Any]]) -> list[Any]:
    """Each component once, in first-seen order (components hash by identity)."""
    return list(dict.fromkeys(c for group in components for c in group))


def _run_all(listeners: list[Listener]) -> Callable[[dict[Any, Any]], Any]:
    def run(values: dict[Any, Any]) -> Any:
        shown: dict[Any, Any] = {}
        for listener in listeners:
            shown.update(listener(values))
        return shown or gr.skip()  # nothing to change: Gradio reads an empty dict as one output's value

    return run


class ChangeEvents:
    """Collects the cheap change listeners of one app while it is laid out; :meth:`wire` adds their events."""

    def __init__(self) -> None:
        self._groups: dict[tuple[int, str], _Group] = {}
        self._wired = False
        self.order = AnswerOrder()  # shared with the app's other writers of these outputs (``listen``)
        self._stamp: gr.Number | None = None

    def listen(self, register: Callable[..., Any], fn: Callable[..., Any], inputs: Any, outputs: Any, *,
               about: Callable[[dict[Any, Any]], str] | None = None, placeholder: bool = False, **options: Any) -> Any:
        """``register(fn, inputs, outputs, **options)`` (``trigger.input``, ``dependency.failure``, a ``gr.on``
        partial) with ``fn``'s answer in the page's order (:class:`AnswerOrder`): for every writer of an output that
        another ordered event writes too (this class's listeners, Inspect and the slot's "Source changed" clear, a
        refused click's status line). The page's number rides in a hidden first input (:data:`SENT_JS`). ``about``:
        what the answer answers for, from the inputs' values (Inspect and the clear: the source box's text);
        ``placeholder``: the answer only says that changed (:meth:`Written.covers`)."""
        if self._stamp is None:  # inside the app's Blocks, where the first ordered event is registered
            self._stamp = gr.Number(value=None, visible=False, elem_id="h3-sent-order")
        answer, components = self.order.ordered(fn, inputs, about, placeholder)
        return register(answer, [self._stamp, *components], outputs,
                        js=SENT_JS.format(inputs=len(components) + 1), **options)

    @property
    def stamp(self) -> gr.Number | None:
        """The hidden input that carries the page's number of each ordered event (None until one is registered)."""
        return self._stamp

    def on(self, triggers: Sequence[Any] | Any, fn: Callable[..., Any], inputs: Any, outputs: Any,
           then: tuple[Callable[..., Any], Any, Any] | None = None) -> None:
        """Like ``gr.on(triggers, fn, inputs, outputs)`` off the queue; ``then``: ``(fn, inputs, outputs)`` run
        right after (once per trigger, after every listener of that trigger)."""
        if self._wired:
            raise RuntimeError("ChangeEvents.on after wire(): register every listener before the app is wired")
        listener = Listener.of(fn, inputs, outputs)
        after = Listener.of(*then) if then is not None else None
        each: list[Any] = list(triggers) if isinstance(triggers, (list, tuple)) else [triggers]
        for trigger in each:
            group = self._groups.setdefault((id(trigger.__self__), trigger.event_name), _Group(trigger))
            group.listeners.append(listener)
            if after is not None and after not in group.then:
                group.then.append(after)

    def wire(self) -> None:
        """One ``always_last`` event per trigger (inside the app's ``gr.Blocks``), its ``then`` chained after."""
        self._wired = True
        for group in self._groups.values():
            event = self.listen(functools.partial(gr.on, [group.trigger]), _run_all(group.listeners),
                                set(_union([listener.inputs for listener in group.listeners])),
                                _union([listener.outputs for listener in group.listeners]),
                                trigger_mode="always_last", **CHEAP)
            if group.then:
                self.listen(event.then, _run_all(group.then), set(_union([listener.inputs for listener in group.then])),
                            _union([listener.outputs for listener in group.then]), **CHEAP)

    def listeners(self, trigger: Any) -> list[Listener]:
        """The listeners registered on ``trigger`` (tests: what one change runs)."""
        group = self._groups.get((id(trigger.__self__), trigger.event_name))
        return list(group.listeners) if group else []
