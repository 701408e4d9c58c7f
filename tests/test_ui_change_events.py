"""The page's redraws on change: one queue-less event per trigger (h3app/ui/change_events.py).

Gradio 6.31's page re-sends a deferred trigger to every ``always_last`` event on it, so two such events on one
trigger can restart each other for as long as the page is open; these tests hold the app to one per trigger
and check that the merged event still gives each listener what it asked for."""

from __future__ import annotations

from collections import defaultdict

import gradio as gr
import pytest

from h3app.ui.change_events import ChangeEvents, Listener


def test_no_trigger_of_the_app_starts_two_queue_less_always_last_events(backend):
    from h3app.ui.app_ui import build_app

    config = build_app(backend).config
    elem_ids = {c["id"]: c.get("props", {}).get("elem_id") for c in config["components"]}
    on_trigger: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for dependency in config["dependencies"]:
        for target, event in dependency["targets"]:
            if target is not None:
                on_trigger[(target, event)].append(dependency)
    redraws = {key: [d for d in deps if d["trigger_mode"] == "always_last" and d["queue"] is False]
               for key, deps in on_trigger.items()}
    doubled = {f"{elem_ids.get(target) or target}.{event}": len(deps) for (target, event), deps in redraws.items()
               if len(deps) > 1}
    assert doubled == {}, f"triggers with several queue-less always_last events: {doubled}"
    # the Override tick's one event still redraws all three places that follow it
    override = next(key for key in redraws if elem_ids.get(key[0]) == "slot1-override" and key[1] == "change")
    written = {elem_ids.get(output) for output in redraws[override][0]["outputs"]}
    assert {"slot1-readout", "apply-note", "a-alpha", "b-scale"} <= written, written


def test_a_listener_gets_what_it_asked_for_and_its_outputs_come_back_keyed():
    with gr.Blocks():
        a, b, out_1, out_2 = gr.Number(1), gr.Number(2), gr.Textbox(), gr.Textbox()
    values = {a: 3, b: 4}
    seen = []

    def keyed(given):
        seen.append(given)
        return {out_1: given[a] * 10}

    assert Listener.of(lambda x, y: (x + y, x * y), [a, b], [out_1, out_2])(values) == {out_1: 7, out_2: 12}
    assert Listener.of(lambda y: y, [b], out_1)(values) == {out_1: 4}
    assert Listener.of(keyed, {a}, [out_1])(values) == {out_1: 30}
    assert Listener.of(lambda x: {}, [a], [out_1, out_2])(values) == {}  # nothing to change: no value is set
    assert seen == [{a: 3}]  # a set of inputs: one dict of exactly those
    skipped = Listener.of(lambda x: gr.skip(), [a], [out_1])(values)
    assert list(skipped) == [out_1] and skipped[out_1] == gr.skip()  # an update for the one output, not a mapping
    with pytest.raises(ValueError):
        Listener.of(lambda x: (1, 2, 3), [a], [out_1, out_2])(values)  # a wrong count is an error, not a drop


def test_one_trigger_runs_its_listeners_in_order_and_registering_late_is_refused():
    changes = ChangeEvents()
    with gr.Blocks() as demo:
        box, first, second = gr.Textbox(), gr.Textbox(), gr.Textbox()
        changes.on([box.change], lambda text: text + "!", [box], [first])
        changes.on([box.change, box.submit], lambda text: text.upper(), [box], [second])
        assert [listener.outputs for listener in changes.listeners(box.change)] == [(first,), (second,)]
        assert len(changes.listeners(box.submit)) == 1
        changes.wire()
        with pytest.raises(RuntimeError, match="after wire"):
            changes.on([box.change], str, [box], [first])
    targets = [tuple(t[1] for t in d["targets"]) for d in demo.config["dependencies"]]
    assert sorted(targets) == [("change",), ("submit",)]
