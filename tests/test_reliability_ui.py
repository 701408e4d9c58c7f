"""Reliability: the UI shows each bad input as ``gr.Error`` carrying exactly the backend's one-line message, the
model stays at its base, and the app serves on. The event functions are called directly (tests/test_ui_*.py cover
the layout; tests/test_reliability_many_users.py drives the named endpoints over HTTP).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr
import pytest
from bad_inputs import corpus_entries
from model_state import assert_at_base, close_server, open_server

from h3app.backend.service import Backend
from h3app.errors import H3AppError
from h3app.request import GenerationRequest
from h3app.settings import LoRASettings
from h3app.ui import session
from h3app.ui.adapter import events
from h3app.ui.forms import SlotForm
from h3app.ui.generate import events as generate
from h3app.ui.presenters.visitor_words import visitor_text

REQUEST = GenerationRequest(prompt="a fox in the snow", seed=1, steps=2)
ENTRIES = {entry.kind: entry for entry in corpus_entries()}
# A few of each stage: refused from the header, from the source text, from the tensors, from the settings.
UI_KINDS = ("html_page", "pickle_renamed_zip", "header_over_100mb", "pruned_h3_lora", "wan_lora", "lokr_misfit",
            "a_without_b", "several_weights_no_name", "weight_name_dotdot", "repo_missing_offline", "nan_weights",
            "reference_partition_only", "user_alpha_negative", "user_alpha_nan", "scale_1e9")


@pytest.fixture(scope="module")
def ui(tiny_model, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    state = open_server(tiny_model, tmp_path_factory.mktemp("ui_outputs"))
    jobs = session.RunningJobs()
    state.update(adapters=events.AdapterEvents(state["backend"], jobs),
                 generate=generate.GenerateEvents(state["backend"], jobs))
    yield state
    close_server(state)


def backend_message(call: Any) -> str:
    with pytest.raises(H3AppError) as caught:
        call()
    return str(caught.value)


def ui_message(call: Any) -> str:
    with pytest.raises(gr.Error) as caught:
        call()
    return caught.value.message


@pytest.mark.parametrize("kind", UI_KINDS)
def test_ui_shows_the_backends_one_line_as_gr_error(kind: str, corpus_dir: Path, ui: dict[str, Any]) -> None:
    bad = ENTRIES[kind].resolve(corpus_dir)
    backend: Backend = ui["backend"]
    ui["backend"].binder.reset()
    override = bad.alpha is not None

    if bad.stage == "settings":
        expected = backend_message(lambda: LoRASettings(source=bad.source, alpha=bad.alpha, strength=bad.strength))
    elif bad.stage == "load":
        expected = backend_message(lambda: backend.load(LoRASettings(source=bad.source, weight_name=bad.weight_name)))
        assert ui["adapters"].inspect(bad.source, bad.weight_name, None, None)["format"]  # the header is fine
    else:
        expected = backend_message(lambda: backend.inspect(bad.source, bad.weight_name, bad.revision))
    assert "\n" not in expected
    expected = visitor_text(expected)  # the same line, with the page's controls for the CLI's flags
    if bad.stage not in ("settings", "load"):
        assert ui_message(lambda: ui["adapters"].inspect(bad.source, bad.weight_name, bad.revision, None)) == expected
    assert_at_base(ui)

    slot = SlotForm(bad.source, bad.weight_name, bad.revision, override, bad.alpha, bad.strength)
    shown = ui_message(lambda: ui["adapters"].load_view(None, "1", slot, "unmerged", "t2va", None))
    assert shown == expected
    assert_at_base(ui)

    if bad.stage != "settings":  # the Generate tab, with a good adapter attached first: back to base, same line
        good = LoRASettings(source=str(corpus_dir / "good_for_settings.safetensors"), alpha=8.0)
        ui["adapters"].load(None, "1", good)
        bad_settings = LoRASettings(source=bad.source, weight_name=bad.weight_name, revision=bad.revision)
        shown = ui_message(lambda: ui["generate"].generate(REQUEST, [good, bad_settings], None, None, None))
        assert shown == expected
        assert_at_base(ui)


def test_the_ui_serves_on_after_the_bad_inputs(corpus_dir: Path, ui: dict[str, Any]) -> None:
    good = LoRASettings(source=str(corpus_dir / "good_for_settings.safetensors"), alpha=8.0)
    output = ui["generate"].generate(REQUEST, [good], None, None, None)
    assert Path(output.video_path).exists() and output.result.frames > 0
    ui["backend"].binder.reset()
    assert_at_base(ui)


def test_uploads_are_capped_and_only_safetensors_are_taken(tiny_model, corpus_dir: Path, tmp_path: Path) -> None:
    good = corpus_dir / "good_for_settings.safetensors"
    pickle = corpus_dir / "zip_pickle_renamed.safetensors"
    limit = (good.stat().st_size + pickle.stat().st_size) // 2
    hosted = Backend(loaded=tiny_model, hosted=True, max_remote_bytes=limit, output_dir=tmp_path / "outputs")
    try:
        panel = events.AdapterEvents(hosted)
        assert "over this server's limit" in ui_message(lambda: panel.upload(str(pickle)))
        assert "not a .safetensors file" in ui_message(lambda: panel.upload(str(corpus_dir / "adapter.pt")))
        source = panel.upload(str(good)).source  # within the limit: taken, and served by path
        assert panel.inspect(source, None, None, None)["num_targets"] == 6
        small_pickle = tmp_path / "innocent.safetensors"  # a pickle under the limit, renamed: refused when read
        small_pickle.write_bytes(pickle.read_bytes()[:limit - 1])
        source = panel.upload(str(small_pickle)).source
        assert "pickle" in ui_message(lambda: panel.inspect(source, None, None, None))
    finally:
        hosted.close()
