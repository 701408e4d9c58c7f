"""Advanced strength on the command line: the flags of --adapter and the same keys in --adapter-spec, on generate,
check and grid; bad values and merged mode are one line (exit 2); the values reach the run's settings JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import assert_one_line, run_cli

from h3app.backend import media
from h3app.commands.model_options import parse_adapter_spec
from h3app.errors import H3AppError

ROOT = Path(__file__).resolve().parents[1]
STYLE = str(ROOT / "assets" / "adapters" / "tiny_style_warm.safetensors")
TURBO = str(ROOT / "assets" / "adapters" / "lightx2v_turbo_no_alpha.safetensors")


def test_adapter_spec_takes_the_advanced_keys_and_lists_with_commas():
    settings = parse_adapter_spec("repo/x,scale=0.5,audio=0,video=0.8,text_strength=1.5,schedule=1,1,0.5,0.25,"
                                  "blocks=0-9:0.5,40-49:1.2,alpha=8", "unmerged")
    assert (settings.strength, settings.alpha) == (0.5, 8.0)
    assert (settings.video_strength, settings.text_strength, settings.audio_strength) == (0.8, 1.5, 0.0)
    assert settings.strength_schedule.label == "1,1,0.5,0.25" and settings.block_strength.label == "0-9:0.5,40-49:1.2"
    same = parse_adapter_spec("repo/x,strength_schedule=linear:1:0.5@0.2-1,block_strength=3:2", "unmerged")
    assert same.strength_schedule.label == "linear:1:0.5@0.2-1" and same.block_strength.label == "3:2"
    with pytest.raises(H3AppError, match="unknown field 'loud=1'"):
        parse_adapter_spec("repo/x,loud=1", "unmerged")
    with pytest.raises(H3AppError, match="unknown field '2'"):
        parse_adapter_spec("repo/x,audio=0,2", "unmerged")  # only schedule= and blocks= continue after a comma
    with pytest.raises(H3AppError, match="merged mode bakes"):
        parse_adapter_spec("repo/x,audio=0", "merged")


@pytest.mark.parametrize("argv, words", [
    (["--audio-strength", "loud"], "audio strength must be a number"),
    (["--strength-schedule", "wiggle:1:2"], "unknown curve"),
    (["--block-strength", "0-9:0.5,5-6:1"], "two ranges"),
    (["--audio-strength", "0", "--lora-mode", "merged"], "needs --lora-mode unmerged"),
])
def test_bad_values_are_one_line_before_anything_loads(capsys, tmp_path, argv, words):
    for command in (["generate", "--prompt", "x", "--out", str(tmp_path / "x.mp4")], ["check"],
                    ["grid", "--prompt", "x", "--out-dir", str(tmp_path)]):
        if command[0] == "check" and "--lora-mode" in argv:
            continue  # check runs unmerged
        result = run_cli(capsys, *command, "--adapter", STYLE, *argv)
        assert result.code == 2, (command, result)
        assert_one_line(result.err, words)


def test_strength_flags_need_an_adapter(capsys, tmp_path):
    result = run_cli(capsys, "generate", "--prompt", "x", "--out", str(tmp_path / "x.mp4"), "--audio-strength", "0")
    assert result.code == 2
    assert_one_line(result.err, "belong to --adapter")


def test_a_schedule_of_another_length_is_refused_naming_both_numbers(capsys, tmp_path):
    result = run_cli(capsys, "generate", "--prompt", "x", "--out", str(tmp_path / "x.mp4"), "--steps", "5",
                     "--adapter", STYLE, "--strength-schedule", "1,0.5")
    assert result.code == 2
    line = assert_one_line(result.err, "2 values but this run has 4 evaluations")
    assert "linear:1:0.5" in line


@pytest.mark.slow
def test_generate_records_the_advanced_strengths_in_the_settings_json(capsys, tmp_path):
    out = tmp_path / "a.mp4"
    result = run_cli(capsys, "generate", "--prompt", "a red ball moving right over a grey floor, low loud hum",
                     "--steps", "4", "--adapter", STYLE, "--audio-strength", "0", "--video-strength", "0.9",
                     "--strength-schedule", "linear:1:0.5", "--block-strength", "1:2",
                     "--adapter-spec", f"{TURBO},alpha=1,schedule=1,0.5,0.25,text=0", "--out", str(out), "--json")
    assert result.code == 0, result.err
    first, second = json.loads(result.out)["adapters"]
    assert (first["audio_strength"], first["video_strength"], first["text_strength"]) == (0.0, 0.9, 1.0)
    assert first["strength_schedule"] == "linear:1:0.5" and first["block_strength"] == "1:2"
    assert second["strength_schedule"] == "1,0.5,0.25" and second["text_strength"] == 0.0
    assert media.read_settings(out)["adapters"] == json.loads(result.out)["adapters"]


def test_check_transformer_mode_is_identical_with_the_advanced_flags(capsys):
    result = run_cli(capsys, "check", "--adapter", TURBO, "--audio-strength", "0", "--video-strength", "0.5",
                     "--block-strength", "0:2", "--strength-schedule", "1,0.5", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["identical"] is True and data["control_identical"] is True
    assert any("schedule" in warning for warning in data["warnings"])
    plain = json.loads(run_cli(capsys, "check", "--adapter", TURBO, "--json").out)
    assert plain["hash_a"] != data["hash_a"]  # the factors did reach the forward
