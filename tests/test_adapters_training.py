"""Training metadata and trigger words (issue 55, item 5): ``adapters/training.py`` reads, from the header alone, the
trainer, epoch, steps, base model, network dim/alpha (shown, never applied) and the trigger words, and ``inspect``
(CLI text and ``--json``), the page's adapter card, its "Add trigger word" button and the MCP inspect tool show them.
Every file is written here with the metadata each trainer writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from adapter_fixtures import TINY_SHAPES, forbid_tensor_loads, kohya_block, save
from cli_runner import run_cli

from h3app.adapters.inspect import inspect_file
from h3app.adapters.training import AI_TOOLKIT, KOHYA, LYCORIS, MUSUBI, SIMPLETUNER, TrainingInfo, read_training

KOHYA_METADATA = {
    "ss_epoch": "4", "ss_steps": "1200", "ss_network_dim": "4", "ss_network_alpha": "1", "ss_output_name": "ohwx_style",
    "ss_network_module": "networks.lora", "ss_base_model_version": "minimax_h3",
    "ss_tag_frequency": json.dumps({"10_ohwx": {"ohwx": 40, "a man": 12, "smiling": 3},
                                    "5_more": {"ohwx": 10, "outdoors": 10}}),
}


def kohya_trained(folder: Path, metadata: dict[str, str] = KOHYA_METADATA, name: str = "ohwx.safetensors") -> Path:
    """A kohya/musubi-layout H3 LoRA at alpha 2 (its ``.alpha`` tensors) with a trainer's metadata."""
    return save(folder / name, kohya_block(0, alpha=2.0), metadata)


def test_inspect_json_of_a_kohya_trained_file_shows_its_trigger_word_and_epoch(tmp_path, capsys):
    path = kohya_trained(tmp_path)
    cli = run_cli(capsys, "inspect", str(path), "--model", "tiny", "--json")
    assert cli.code == 0, cli.err
    training = json.loads(cli.out)["training"]
    assert training["trigger_words"] == ["ohwx"] and training["sources"]["trigger_words"] == "ss_tag_frequency"
    assert training["epoch"] == 4 and training["steps"] == 1200 and training["trainer"] == KOHYA
    assert training["base_model"] == "minimax_h3" and training["output_name"] == "ohwx_style"
    assert training["tags"][:3] == [["ohwx", 50], ["a man", 12], ["outdoors", 10]]
    text = run_cli(capsys, "inspect", str(path), "--model", "tiny")
    assert "trigger      ohwx (from ss_tag_frequency)" in text.out and "epoch 4" in text.out
    assert f"trained with {KOHYA}" in text.out


def test_the_network_alpha_is_shown_never_applied_and_nothing_but_the_header_is_read(tmp_path, monkeypatch):
    """``ss_network_alpha`` 1 beside ``.alpha`` tensors of 2: the run's alpha is 2; without the tensors it is the
    rank fallback, still not 1."""
    forbid_tensor_loads(monkeypatch)
    info = inspect_file(kohya_trained(tmp_path), shapes=TINY_SHAPES)
    assert info.training.network_alpha == 1.0 and info.training.network_dim == 4.0
    assert info.to_json()["resolved"]["resolved_alpha"] == 2.0
    bare = {k: v for k, v in kohya_block(0).items()}
    info = inspect_file(save(tmp_path / "bare.safetensors", bare, KOHYA_METADATA), shapes=TINY_SHAPES)
    assert info.training.network_alpha == 1.0 and info.to_json()["resolved"]["alpha_source"] == "rank_fallback"


@pytest.mark.parametrize(("metadata", "trainer", "expected"), [
    ({"ss_minimax_h3_audio_loss_weight": "0.5", "ss_minimax_h3_video_only": "False", "ss_epoch": "2",
      "ss_network_module": "networks.lora"}, MUSUBI, {"epoch": 2}),
    ({"ss_network_module": "networks.lora_wan", "ss_steps": "30"}, MUSUBI, {"steps": 30}),
    ({"software": json.dumps({"name": "ai-toolkit", "url": "https://github.com/ostris/ai-toolkit"}),
      "training_info": json.dumps({"step": 500}), "name": "sks_run", "ss_output_name": "sks_run",
      "ss_tag_frequency": json.dumps({"1_sks": {"sks": 1}})}, AI_TOOLKIT,
     {"steps": 500, "trigger_words": ["sks"], "output_name": "sks_run"}),
    ({"software": json.dumps({"name": "ai-toolkit"}), "ss_tag_frequency": json.dumps({"1_sks": {"sks": 1}}),
      "config": json.dumps({"config": {"process": [{"type": "sd_trainer", "trigger_word": "zxq person",
                                                    "model": {"name_or_path": "MiniMaxAI/MiniMax-H3"}}]}})},
     AI_TOOLKIT, {"trigger_words": ["zxq person"], "base_model": "MiniMaxAI/MiniMax-H3"}),
    ({"ss_dataset_dirs": json.dumps({"10_ohwx man": {"n_repeats": 10, "img_count": 20}}), "ss_epoch": "1"},
     KOHYA, {"trigger_words": ["ohwx man"], "tags": []}),
    ({"lycoris_config": json.dumps({"algo": "lokr"}), "modelspec.trigger_phrase": "in the style of qwx"},
     SIMPLETUNER, {"trigger_words": ["in the style of qwx"]}),
    ({"ss_network_module": "lycoris.kohya", "ss_epoch": "None"}, LYCORIS, {"epoch": None}),
])
def test_each_trainer_is_named_from_what_it_writes(metadata, trainer, expected):
    info = read_training(metadata)
    assert info.trainer == trainer
    for key, value in expected.items():
        assert info.to_json()[key] == value, key
    assert TrainingInfo.from_json(info.to_json()) == info


def test_malformed_metadata_is_left_out_never_raised():
    info = read_training({"ss_tag_frequency": "{not json", "ss_epoch": "-3", "ss_steps": "1e400",
                          "software": "[1, 2]", "ss_network_dim": "nan", "training_info": "3"})
    assert (info.epoch, info.steps, info.network_dim, info.trigger_words) == (None, None, None, ())
    assert not read_training({}) and read_training({}).trainer is None


def test_a_runs_checkpoints_sort_by_their_progress():
    """What the grid over epochs (issue 52) orders files by: steps, then epoch; unknown first."""
    names = {"late": {"ss_steps": "900", "ss_epoch": "3"}, "early": {"ss_steps": "300", "ss_epoch": "1"},
             "unknown": {}, "middle": {"ss_epoch": "2", "ss_steps": "600"}}
    assert sorted(names, key=lambda n: read_training(names[n]).order) == ["unknown", "early", "middle", "late"]


def test_the_page_card_and_its_trigger_button_and_the_mcp_tool_show_it(tmp_path, backend):
    from h3app.ui.adapter.events import AdapterEvents
    from h3app.ui.compare.events import ComparisonEvents
    from h3app.ui.forms import SlotForm
    from h3app.ui.generate.events import GenerateEvents, trigger_button, with_trigger
    from h3app.ui.hub.events import HubEvents
    from h3app.ui.serving.api import ApiEvents
    from h3app.ui.serving.mcp_tools import McpTools
    from h3app.ui.session import RunningJobs

    path = kohya_trained(tmp_path)
    jobs = RunningJobs()
    adapters = AdapterEvents(backend, jobs)
    view = adapters.inspect_view(SlotForm(source=str(path)))
    assert "data-testid='training'" in view.inspect_html and "<b>ohwx</b>" in view.inspect_html
    assert "epoch 4" in view.inspect_html and "1,200 steps" in view.inspect_html
    button = trigger_button(view.info)
    assert button["visible"] is True and "ohwx" in button["value"]
    assert with_trigger("a man walking", view.info) == "ohwx, a man walking"
    assert with_trigger("ohwx, a man", view.info) == "ohwx, a man"  # already there: unchanged
    api = ApiEvents(adapters, GenerateEvents(backend, jobs), ComparisonEvents(backend, jobs))
    answer = json.loads(McpTools(api, HubEvents(backend)).inspect_adapter(str(path), "", "", ""))
    assert answer["training"]["trigger_words"] == ["ohwx"] and answer["training"]["epoch"] == 4
