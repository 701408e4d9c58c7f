"""``check --mode transformer``: the seeded packed input, the check function's JSON, and the CLI wiring."""

import hashlib
import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from lora_fixtures import block_targets, build_tiny, linear_shapes, make_adapter, module_types, state_hash  # noqa: E402

from h3app.backend.transformer_check import packed_check_input, run_transformer_check  # noqa: E402
from h3app.commands import check as check_command  # noqa: E402
from h3app.errors import H3AppError  # noqa: E402
from h3app.lora import LoRAEngine  # noqa: E402
from h3app.rules.check_pair import CheckSetting, parse_setting  # noqa: E402
from h3app.settings import LoRASettings  # noqa: E402

A, B = CheckSetting(8.0, 1.0), CheckSetting(128.0, 0.0625)


@pytest.fixture(scope="module")
def shapes():
    return linear_shapes(build_tiny())


def test_packed_input_layout_and_seed():
    config = build_tiny().config
    x = packed_check_input(config, seed=5)
    assert x["hidden_states"].shape == (1, 8, 16) and x["audio_hidden_states"].shape == (1, 6, 8)
    assert x["encoder_hidden_states"].shape == (1, 4, 8)
    assert x["token_tags"].tolist() == [1] * 4 + [2] * 6 + [0] * 8
    assert x["timestep_indices"].tolist() == [0] * 4 + [1] * 6 + [0] * 8
    assert x["position_ids"][4:10].tolist() == [[4, 0, 0], [5, 0, 0], [6, 0, 0], [4, 0, 1], [5, 0, 1], [6, 0, 1]]
    assert x["position_ids"][10:].tolist()[:3] == [[4, 0, 0], [4, 0, 1], [4, 1, 0]]
    assert x["video_indices"].tolist() == list(range(10, 18))
    again, other = packed_check_input(config, seed=5), packed_check_input(config, seed=6)
    assert all(torch.equal(x[k], again[k]) for k in x)
    assert not torch.equal(x["hidden_states"], other["hidden_states"])


def test_parse_setting():
    assert parse_setting("8:1.0") == CheckSetting(8.0, 1.0)
    assert parse_setting("auto:-0.5") == CheckSetting(None, -0.5)
    for bad in ("8", "x:1", "0:1", "8:nan"):
        with pytest.raises(H3AppError):
            parse_setting(bad)


def test_check_finds_the_pair_identical_and_the_fallback_different(shapes):
    model = build_tiny()
    before, types = state_hash(model), module_types(model)
    adapter = make_adapter(shapes, block_targets(shapes), rank=16, alpha=None)
    result = run_transformer_check(model, adapter, a=A, b=B, seed=0, source="synthetic")
    assert result["identical"] is True and result["hash_a"] == result["hash_b"]
    assert result["control_identical"] is True
    assert result["max_abs_diff"] == 0.0
    assert result["hash_fallback"] != result["hash_a"] and result["fallback_max_abs_diff"] > 0
    assert result["effective_scale_a"] == result["effective_scale_b"] == 0.5
    assert result["mode"] == "transformer" and result["seconds"] >= 0 and result["matched"] == len(adapter.modules)
    assert state_hash(model) == before and module_types(model) == types  # left adapter-free
    assert not torch.are_deterministic_algorithms_enabled()  # restored

    # hash_a is sha256(video fp32 bytes + audio fp32 bytes) of the same forward done by hand
    engine = LoRAEngine(model)
    engine.attach(adapter, LoRASettings(source="s", alpha=8, strength=1.0), "x")
    with torch.no_grad():
        out = model(**packed_check_input(model.config, 0), return_dict=True)
    raw = out.sample.contiguous().numpy().tobytes() + out.audio_sample.contiguous().numpy().tobytes()
    assert hashlib.sha256(raw).hexdigest() == result["hash_a"]


def test_check_reports_a_difference_and_scales_per_rank(shapes):
    targets = block_targets(shapes)
    ranks = {t: (64 if ".attn." in t else 16) for t in targets}
    adapter = make_adapter(shapes, targets, rank=ranks, alpha=None)
    result = run_transformer_check(build_tiny(), adapter, a=A, b=CheckSetting(8.0, 0.5), seed=1)
    assert result["identical"] is False and result["max_abs_diff"] > 0
    assert result["effective_scale_a"] == {"64": 8 / 64, "16": 8 / 16}
    assert result["effective_scale_b"] == {"64": 4 / 64, "16": 4 / 16}
    assert result["ranks"] == [64, 16]


def test_auto_alpha_uses_the_chain(shapes):
    adapter = make_adapter(shapes, block_targets(shapes), rank=16, alpha=8.0, alpha_source="metadata")
    result = run_transformer_check(build_tiny(), adapter, a=CheckSetting(None, 1.0), b=B)
    assert result["identical"] is True and result["effective_scale_a"] == 0.5


def test_cli_json(shapes, monkeypatch, capsys):
    import h3app.model.loader as loader
    from h3app.cli import main

    adapter = make_adapter(shapes, block_targets(shapes), rank=4, alpha=None)
    monkeypatch.setattr(loader, "load_transformer", lambda model, **kwargs: build_tiny())
    monkeypatch.setattr(check_command, "load_check_adapter", lambda args, transformer, *group: adapter)
    assert main(["check", "--model", "tiny", "--adapter", "some/adapter", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("identical", "hash_a", "hash_b", "hash_fallback", "max_abs_diff", "fallback_max_abs_diff",
                "control_identical", "effective_scale_a", "effective_scale_b", "mode", "seconds"):
        assert key in result
    assert result["identical"] is True and result["a"] == "8:1" and result["b"] == "128:0.0625"
    assert main(["check", "--adapter", "x", "--a", "eight:1"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
