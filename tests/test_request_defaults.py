"""Each request default once (``rules/request_defaults.py``), per model: the UI's controls, the API's inputs, the CLI
commands and the plan all use the same steps, seed, clip length and grid axes for the tiny and for the full model;
a known distilled adapter still brings its own steps; no other steps/seed default is spelled in the package."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from h3app.rules.choices import REAL_REPO_ID, TINY_REPO_ID
from h3app.rules.frames import RELEASED
from h3app.rules.request_defaults import FULL_DEFAULTS, SEED, TINY_DEFAULTS, RequestDefaults, defaults_for

H3APP = Path(__file__).resolve().parents[1] / "h3app"
MODELS = {"tiny": ("tiny", TINY_DEFAULTS), "full": (REAL_REPO_ID, FULL_DEFAULTS)}


class Captured(Exception):
    """Raised by the stand-ins below once the command has built what it would run."""


class StubBackend:
    """Stands in for ``Backend`` in the commands: records the request (and grid axes) instead of running it."""

    seen: dict = {}

    def __init__(self, model, options=None, **kwargs):
        StubBackend.seen = {"model": model}

    def generate(self, request, adapters, token, previews=None):
        StubBackend.seen["request"] = request
        raise Captured

    def plan_grid(self, alphas, strengths, seeds, adapters=1):
        StubBackend.seen["axes"] = (alphas, strengths, seeds)
        return object()

    def grid(self, request, adapter, plan, token, previews=None):
        StubBackend.seen["request"] = request
        raise Captured

    def close(self):
        return None


def _cli(monkeypatch, argv: list[str]) -> dict:
    """What ``python -m h3app ARGV`` would run (generate and grid through the stub, check through its full job)."""
    from h3app.backend import equivalence, service
    from h3app.cli import build_parser

    monkeypatch.setattr(service, "Backend", StubBackend)

    def full_check(job, token):
        StubBackend.seen = {"request": job.request}
        raise Captured

    monkeypatch.setattr(equivalence, "run_full_check", full_check)
    args = build_parser().parse_args(argv)
    with pytest.raises(Captured):
        args.run(args)
    return StubBackend.seen


def _components(demo) -> dict[str, object]:
    """The app's components by elem_id (and by label)."""
    found = {}
    for block in demo.blocks.values():
        for key in (getattr(block, "elem_id", None), getattr(block, "label", None)):
            if key:
                found.setdefault(key, block)
    return found


@pytest.mark.parametrize("kind", MODELS)
def test_the_ui_the_api_the_cli_and_the_plan_use_each_models_defaults(kind, tiny_model, monkeypatch, tmp_path):
    from h3app.backend.service import Backend
    from h3app.cli import build_parser
    from h3app.commands.plan import plan_options
    from h3app.ui.app_ui import build_app

    model, defaults = MODELS[kind]
    assert defaults_for(model) is defaults
    # the UI and the API of an app serving this model (the tiny weights stand in; its defaults are the model's)
    monkeypatch.setattr(Backend, "defaults", property(lambda self: defaults))
    backend = Backend(loaded=tiny_model, output_dir=tmp_path)
    try:
        demo = build_app(backend)
        found = _components(demo)
    finally:
        backend.close()
    ui = {"seed": found["seed"].value, "steps": found["steps"].value, "duration": found["duration"].value,
          "grid": (found["grid-alphas"].value, found["grid-scales"].value, found["grid-seeds"].value),
          "prompt": found["prompt"].value}
    api = {"seed": _api(found, "seed"), "steps": _api(found, "steps"), "duration": _api(found, "duration"),
           "grid": (_api(found, "alphas"), _api(found, "scales"), _api(found, "seeds")), "prompt": _api(found, "prompt")}
    # the line on what the model knows and its one-click samples: the tiny model's only
    samples = [b.value for b in demo.blocks.values() if "h3-sample" in (getattr(b, "elem_classes", None) or [])]
    assert samples == list(defaults.sample_prompts)
    assert ("prompt-knows" in found) == bool(defaults.knows)
    # the CLI: generate, grid and check as they would run, with nothing but the model given
    generate = _cli(monkeypatch, ["generate", "--model", model, "--prompt", "x", "--out", str(tmp_path / "x.mp4")])
    grid = _cli(monkeypatch, ["grid", "--model", model, "--adapter", "a.safetensors", "--prompt", "x",
                              "--out-dir", str(tmp_path)])
    check = _cli(monkeypatch, ["check", "--model", model, "--adapter", "a.safetensors", "--mode", "full"])
    plan, _, _ = plan_options(build_parser().parse_args(["plan", "--model", "full" if kind == "full" else "tiny"]))

    expected = {"seed": defaults.seed, "steps": defaults.steps, "duration": defaults.duration,
                "grid": (defaults.grid.alphas, defaults.grid.scales, defaults.grid.seeds), "prompt": defaults.prompt}
    assert ui == expected and api == expected
    for name, request in (("generate", generate["request"]), ("grid", grid["request"]), ("check", check["request"])):
        assert request.steps == defaults.steps, name
        assert RELEASED.frames(request.duration) == defaults.frames == plan.frames, name
        assert (request.height, request.width) == (defaults.height, defaults.width), name
    assert generate["request"].seed == check["request"].seed == defaults.seed == SEED
    assert grid["axes"][2] == [int(s) for s in defaults.grid.seeds.split(",")]
    assert list(grid["axes"][0]) == [float(a) for a in defaults.grid.alphas.split(",")]
    assert list(grid["axes"][1]) == [float(s) for s in defaults.grid.scales.split(",")]
    assert plan.steps == defaults.steps and (plan.height, plan.width) == defaults.planned_canvas


def _api(found: dict, name: str):
    """The default of the API's hidden input ``name`` (``ui/serving/api.py`` gives each the elem_id ``api-NAME``)."""
    return found[f"api-{name}"].value


def test_the_full_model_asks_for_the_published_request_and_the_tiny_one_stays_small():
    assert FULL_DEFAULTS.planned_canvas == (768, 1344) and FULL_DEFAULTS.frames == 124
    assert FULL_DEFAULTS.steps >= 20 and (FULL_DEFAULTS.height, FULL_DEFAULTS.width) == (None, None)
    assert TINY_DEFAULTS.steps < FULL_DEFAULTS.steps and TINY_DEFAULTS.planned_canvas == (64, 96)
    assert defaults_for("tiny") is TINY_DEFAULTS and defaults_for("h3app/tiny-h3") is TINY_DEFAULTS
    assert defaults_for("/some/local/copy") is FULL_DEFAULTS and defaults_for(REAL_REPO_ID) is FULL_DEFAULTS


def test_the_tiny_models_prompts_are_sentences_it_was_trained_on():
    """The tiny page's default, its samples and its Turbo preset's prompt are sentences of the training grammar
    (``model/tiny_training/scenes.py``), and the one line on what it knows spells that grammar; the full model keeps
    the published kind of prompt and shows no such line."""
    from h3app.adapters.known import KNOWN_ADAPTERS
    from h3app.model.tiny_training import scenes
    from h3app.rules.request_defaults import FULL_PROMPT, TINY_GRAMMAR

    trained = {words.text for words in scenes.all_prompts()}
    tiny_presets = [k.prompt for k in KNOWN_ADAPTERS if k.repo_id == TINY_REPO_ID and k.prompt]
    assert tiny_presets and len(TINY_DEFAULTS.sample_prompts) >= 3
    for prompt in (TINY_DEFAULTS.prompt, *TINY_DEFAULTS.sample_prompts, *tiny_presets):
        assert prompt in trained, prompt
    assert len(set(TINY_DEFAULTS.sample_prompts)) == len(TINY_DEFAULTS.sample_prompts)
    choices = ["|".join(words) for words in (scenes.BALL_COLOURS, scenes.MOTIONS, scenes.FLOOR_COLOURS,
                                              scenes.PITCHES, scenes.LOUDNESS)]
    grammar = scenes.PromptWords(*(f"{{{c}}}" for c in choices)).text
    assert TINY_GRAMMAR == grammar and grammar in TINY_DEFAULTS.knows
    assert FULL_DEFAULTS.prompt == FULL_PROMPT not in trained
    assert FULL_DEFAULTS.knows == "" and FULL_DEFAULTS.sample_prompts == ()


def test_the_released_canvas_rule_is_the_pipelines(tiny_model):
    """The canvas rule a request is checked against before loading is the loaded pipeline's (tiny), and the full
    rehearsal's pipeline config (full)."""
    from h3app.backend.limits import model_limits
    from h3app.hardware.full_size import CANVAS_CONFIG

    limits = model_limits(tiny_model.pipeline("t2va"))
    assert (limits.canvas_multiple, limits.max_pixels) == (TINY_DEFAULTS.canvas_multiple, TINY_DEFAULTS.max_pixels)
    assert CANVAS_CONFIG["canvas_max_pixels"] == FULL_DEFAULTS.max_pixels == 768 * 1344


def test_a_known_distilled_adapter_still_brings_its_own_steps_and_the_ui_says_so():
    from h3app.adapters.known import KNOWN_ADAPTERS
    from h3app.backend.presets import resolve_presets
    from h3app.ui.generate.events import steps_note

    turbo = next(k for k in KNOWN_ADAPTERS if k.steps is not None and k.steps < FULL_DEFAULTS.steps)
    given = {"steps": None, "shift": None, "audio_shift": None, "workflow": None}
    with_preset = resolve_presets(given, turbo, FULL_DEFAULTS)
    assert with_preset.fields["steps"] == turbo.steps and any("steps=" in note for note in with_preset.notes)
    assert resolve_presets(given, None, FULL_DEFAULTS).fields["steps"] == FULL_DEFAULTS.steps
    assert resolve_presets({**given, "steps": 30}, turbo, FULL_DEFAULTS).fields["steps"] == 30  # typed wins
    note = steps_note(FULL_DEFAULTS.steps, {"known": {"steps": turbo.steps, "title": turbo.title}})
    assert f"made for **{turbo.steps} steps**" in note and "Apply preset" in note


# A steps or seed default spelled as a number: a dataclass field or parameter, an argparse flag, a dict/tuple entry,
# a .get fallback, a Gradio control's value, a steps note.
LITERAL = re.compile(
    r"\b(seed|steps)\s*:\s*[\w\[\], |.]+=\s*\d|--(seed|steps)[\"'].*default\s*=\s*\d|\.get\(\s*[\"'](seed|steps)[\"']"
    r"\s*,\s*\d|\(\s*[\"'](seed|steps)[\"']\s*,\s*\d|label=[\"'](Seed|Steps)[\"'][^)]*value\s*=\s*\d|"
    r"value\s*=\s*\d[^)]*label=[\"'](Seed|Steps)[\"']|steps_note\(\s*\d")


def test_no_steps_or_seed_default_is_spelled_outside_rules():
    found = [f"{path.relative_to(H3APP)}:{number}: {line.strip()}"
             for path in sorted(H3APP.rglob("*.py")) if "rules" not in path.parts
             for number, line in enumerate(path.read_text().splitlines(), 1) if LITERAL.search(line)]
    assert found == []
    assert LITERAL.search('    p.add_argument("--steps", type=int, default=5)')  # the scan can fail
    assert LITERAL.search("    seed: int = 0") and LITERAL.search('request.get("steps", 5)')
    assert isinstance(defaults_for("tiny"), RequestDefaults)
