"""Copy-as snippets run as printed, in local and in hosted mode (docs/ui.md, "copy as CLI"): a Generate from the page
with a demo adapter, then its h3app command run as the visitor would paste it (it makes the same video, bit for
bit) and its diffusers snippet executed — the export line it names, then the Python — on the CPU, from a folder that
holds the app's ``assets`` (the repository root as a visitor's clone has it). sglang is not installed here: its
command is checked for the adapter path the visitor's source box had."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from cli_runner import ROOT, run_cli

from h3app.adapters.known import TINY_DEMO_DIR
from h3app.backend.service import Backend
from h3app.ui.adapter.events import AdapterEvents
from h3app.ui.forms import JobForm, RequestForm, SlotForm
from h3app.ui.generate.events import GenerateEvents
from h3app.ui.session import RunningJobs, with_adapter

pytestmark = pytest.mark.slow

TURBO = TINY_DEMO_DIR / "tiny_turbo_4step.safetensors"
PROMPT = "a red ball moving right over a grey floor, low soft hum"


@pytest.fixture(scope="module", params=["local", "hosted"])
def page_run(request, tiny_model, tmp_path_factory):
    """A Generate from the page with the demo Turbo (steps 3, 16 × 16): (mode, its GenerateView)."""
    hosted = request.param == "hosted"
    backend = Backend(loaded=tiny_model, hosted=hosted, output_dir=tmp_path_factory.mktemp(f"snippets_{request.param}"))
    try:
        jobs = RunningJobs()
        adapters, generate = AdapterEvents(backend, jobs), GenerateEvents(backend, jobs)
        pick = adapters.pick_demo(str(TURBO) if not hosted else dict(adapters.demo_choices())[TURBO.name])
        slot = SlotForm(source=pick.source, weight=pick.weight["value"])
        session = with_adapter(None, "1", slot.settings("unmerged"))
        form = JobForm(session, "unmerged", RequestForm(prompt=PROMPT, seed=3, steps=3, height=16, width=16))
        yield request.param, generate.generate_view(form, progress=None)
    finally:
        backend.binder.reset()
        backend.close()


def command_words(snippet: str) -> list[str]:
    """A shell snippet's command as a shell reads it: comments dropped, continued lines joined."""
    body = " ".join(line.rstrip("\\").strip() for line in snippet.splitlines() if not line.startswith("#"))
    return shlex.split(body)


@pytest.fixture
def visitor_folder(tmp_path, monkeypatch):
    """A folder that holds the app's ``assets`` (as a clone of the repository does), made the working folder."""
    (tmp_path / "assets").symlink_to(ROOT / "assets")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_h3app_command_runs_as_printed_and_makes_the_same_video(page_run, visitor_folder, capsys):
    mode, view = page_run
    words = command_words(view.h3app_command)
    assert words[:3] == ["python", "-m", "h3app"]
    source = words[words.index("--adapter") + 1]
    if mode == "hosted":  # the path the visitor's source box showed, not a bare name nor a server folder
        assert source == "assets/adapters/tiny_turbo_4step.safetensors", source
    cli = run_cli(capsys, *words[3:])
    assert cli.code == 0, cli.err
    assert json.loads(cli.out)["hash"] == view.settings_json["result"]["hash"]
    assert (visitor_folder / "out.mp4").is_file()


def test_the_diffusers_snippet_runs_on_the_cpu_as_printed(page_run, visitor_folder, capsys):
    mode, view = page_run
    snippet = view.diffusers_snippet
    assert 'pipe.to("cuda")' not in snippet and "pipe.to('cpu')" in snippet
    (export,) = [line.lstrip("# ") for line in snippet.splitlines() if "python -m h3app export" in line]
    words = shlex.split(export)
    assert run_cli(capsys, *words[3:]).code == 0
    namespace: dict = {}
    exec(compile(snippet, "<diffusers snippet>", "exec"), namespace)
    video, audio = namespace["video"], namespace["audio"]
    result = view.settings_json["result"]
    assert video.shape[:3] == (result["frames"], result["height"], result["width"]) and audio.shape[0] == 2


def test_the_sglang_command_names_the_adapter_as_the_source_box_had_it(page_run):
    mode, view = page_run
    words = command_words(view.sglang_command)
    path = Path(words[words.index("--lora-path") + 1])
    assert path.name == TURBO.name and (path.is_absolute() if mode == "local" else not path.is_absolute())
    assert (Path(ROOT) / path).is_file()
