"""One resolution: every demo adapter, reached through every kind of source, shows the same resolved alpha, alpha
source and effective scale on every surface — inspect (backend, UI, API, CLI JSON), load, generate, check, grid,
the history entry — and the engine runs exactly those scales.

The cheap surfaces run for every adapter × source kind; a job (generate, grid, check, the API's /generate, the
CLI's generate) carries every adapter of one source kind at once where it can, so the whole matrix costs a few
tiny generations per source kind.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from cli_runner import run_cli

from h3app.adapters.inspect import inspect_file
from h3app.adapters.known import TINY_DEMO_DIR, TINY_DEMO_REPO
from h3app.adapters.resolved import resolve_adapter
from h3app.backend.adapter_binding import adapter_slot_name
from h3app.request import GenerationRequest
from h3app.rules.h3_modules import group_of
from h3app.settings import LoRASettings
from h3app.ui.adapter.events import AdapterEvents
from h3app.ui.forms import SlotForm
from h3app.ui.session import add_history

DEMOS = sorted(p for p in TINY_DEMO_DIR.iterdir() if p.suffix == ".safetensors" or p.is_dir())
FILE_KINDS = ("local", "demo_pick", "hub", "resolve_url", "upload")
FAST = {"steps": 2, "height": 16, "width": 16}


def weight_path(demo: Path) -> str:
    """The weight file's path inside the demo repo (a PEFT folder holds one adapter_model.safetensors)."""
    return demo.name if demo.is_file() else f"{demo.name}/adapter_model.safetensors"


def matrix() -> list[Any]:
    """Every demo adapter × every source kind that can name it (an upload is one file: a PEFT folder's
    adapter_config.json would stay behind)."""
    cases = []
    for demo in DEMOS:
        cases += [pytest.param(demo, k, id=f"{demo.name}-{k}") for k in FILE_KINDS if demo.is_file() or k != "upload"]
        cases.append(pytest.param(demo, "folder_url", id=f"{demo.name}-folder_url"))
    return cases


def source_of(kind: str, demo: Path, hub: Any, events: AdapterEvents, tmp_path: Path) -> tuple[str, str | None]:
    """``(source, weight_name)`` as a person gives them for ``kind``."""
    if kind == "local":
        return str(demo), None if demo.is_file() else "adapter_model.safetensors"
    if kind == "demo_pick":
        value = dict((label, path) for label, path in events.demo_choices())[demo.name]
        pick = events.pick_demo(value)
        return pick.source, pick.weight["value"]
    if kind == "hub":
        return TINY_DEMO_REPO, weight_path(demo)
    if kind == "resolve_url":
        return f"{hub.endpoint}/{TINY_DEMO_REPO}/resolve/main/{weight_path(demo)}", None
    if kind == "folder_url":
        folder = "" if demo.is_file() else f"/{demo.name}"
        return f"{hub.endpoint}/{TINY_DEMO_REPO}/tree/main{folder}", Path(weight_path(demo)).name
    if kind == "upload":
        picked = tmp_path / "picked" / demo.name
        picked.parent.mkdir(exist_ok=True)
        shutil.copyfile(demo, picked)
        stored = events.upload(str(picked))
        return stored.source, stored.weight["value"]
    raise AssertionError(kind)


def expected(demo: Path) -> dict[str, Any]:
    """What the file and the registry say, from the library's own inspection of the shipped file."""
    config = demo / "adapter_config.json" if demo.is_dir() else None
    path = demo / "adapter_model.safetensors" if demo.is_dir() else demo
    return facts(resolve_adapter(inspect_file(path, adapter_config_path=config)).to_json())


def facts(resolved: dict[str, Any]) -> dict[str, Any]:
    """The part every surface must agree on."""
    return {"alpha": resolved["alpha"], "alpha_source": resolved["alpha_source"],
            "resolved_alpha": resolved["resolved_alpha"], "effective_scale": resolved["effective_scale"],
            "groups": [(g["group"], g["rank"], g["alpha"], g["alpha_source"], g["effective_scale"])
                       for g in resolved["groups"]]}


@pytest.fixture
def hub(fake_hub):
    fake_hub.add_repo(TINY_DEMO_REPO, TINY_DEMO_DIR)
    return fake_hub


@pytest.fixture(scope="module")
def events(backend):
    return AdapterEvents(backend)


def test_the_demo_turbo_runs_the_registry_alpha_inspect_shows():
    """Finding 1: alpha 1 from the registry (rank 16 → effective 0.0625), not the rank fallback's 16."""
    turbo = expected(TINY_DEMO_DIR / "tiny_turbo_4step.safetensors")
    assert (turbo["alpha"], turbo["alpha_source"], turbo["effective_scale"]) == (1.0, "registry", 0.0625)


@pytest.mark.parametrize("demo,kind", matrix())
def test_every_source_kind_resolves_alike_on_inspect_load_and_the_cli(demo, kind, hub, backend, events, tmp_path,
                                                                      capsys):
    want = expected(demo)
    source, weight = source_of(kind, demo, hub, events, tmp_path)
    seen = {"backend inspect": facts(backend.inspect(source, weight).to_json()["resolved"])}
    slot = SlotForm(source=source, weight=weight)
    ui = events.inspect_view(slot)
    seen["ui inspect"] = facts(ui.info["resolved"])
    if not isinstance(want["effective_scale"], dict):  # the readout's headline is the resolved scale
        assert f">{want['effective_scale']:.6g}<" in ui.readout
    cli = run_cli(capsys, "inspect", source, *(["--weight-name", weight] if weight else []), "--model", "tiny",
                  "--json")
    assert cli.code == 0, cli.err
    seen["cli inspect --json"] = facts(json.loads(cli.out)["resolved"])
    settings = LoRASettings(source=source, weight_name=weight)
    loaded = backend.load(settings)
    seen["load"] = facts(loaded.provenance["resolved"])
    engine = backend.binder.engine().effective_scales(adapter_slot_name(settings))
    groups = {(g["group"], g["rank"], g["alpha"]): g["effective_scale"]
              for g in loaded.provenance["resolved"]["groups"]}
    ranks, alphas = loaded.info.ranks, loaded.info.alphas
    assert engine and {t: groups[(group_of(t), ranks[t], alphas[t])] for t in engine} == engine
    backend.binder.reset()
    for surface, got in seen.items():
        assert got == want, f"{demo.name} via {kind}: {surface} shows {got}, the file and registry give {want}"


def job_adapters(kind: str, hub: Any, events: AdapterEvents, tmp_path: Path) -> list[tuple[Path, LoRASettings]]:
    return [(demo, LoRASettings(*source_of(kind, demo, hub, events, tmp_path))) for demo in DEMOS
            if kind != "upload" or demo.is_file()]


@pytest.mark.slow
@pytest.mark.parametrize("kind", FILE_KINDS)
def test_every_job_surface_carries_the_same_resolution(kind, hub, backend, events, tmp_path):
    """generate (its JSON and the history entry), grid and check — one job per surface, every demo adapter at
    once where a job takes several."""
    adapters = job_adapters(kind, hub, events, tmp_path)
    request = GenerationRequest(prompt="a red ball", **FAST)
    output = backend.generate(request, [s for _, s in adapters])
    entry = add_history(None, kind="generate", label="x", video=output.video_path, thumbnail=output.thumbnail_path,
                        hash=output.to_json()["hash"], settings=output.settings).history[-1]
    for (demo, _), shown, stored in zip(adapters, output.to_json()["adapters"], entry.settings["adapters"]):
        assert facts(shown["resolved"]) == facts(stored["resolved"]) == expected(demo), f"{demo.name} via {kind}"
    turbo = next(s for d, s in adapters if d.name == "tiny_turbo_4step.safetensors")
    want = expected(TINY_DEMO_DIR / "tiny_turbo_4step.safetensors")
    plan = backend.plan_grid([None], [1.0], [0])
    cells = list(backend.grid(request, turbo, plan))
    assert facts(cells[0].to_json()["adapter"]["resolved"]) == want
    check = backend.check_equivalence(request, turbo)
    assert facts(check.settings["adapter"]["resolved"]) == want
    # the check measures the engine: A's scale is the resolution of A's settings
    a = check.to_json()["a"]
    info = backend.inspect(turbo.source, turbo.weight_name)
    assert check.a.effective_scale == resolve_adapter(info, a["alpha"], a["strength"]).effective_scale


@pytest.mark.slow
def test_the_cli_generate_json_and_the_api_show_the_same_resolution(hub, backend, events, tmp_path, capsys):
    from app_fixtures import running_app
    from gradio_client import Client

    adapters = job_adapters("hub", hub, events, tmp_path) + job_adapters("local", hub, events, tmp_path)[:3]
    specs = [f"{s.source}" + (f",weight={s.weight_name}" if s.weight_name else "") for _, s in adapters]
    cli = run_cli(capsys, "generate", "--model", "tiny", "--prompt", "a red ball", "--steps", "2", "--height", "16",
                  "--width", "16", "--out", str(tmp_path / "x.mp4"), "--json",
                  *[arg for spec in specs for arg in ("--adapter-spec", spec)])
    assert cli.code == 0, cli.err
    for (demo, _), shown in zip(adapters, json.loads(cli.out)["adapters"]):
        assert facts(shown["resolved"]) == expected(demo), f"CLI generate: {demo.name}"
    pair = [a for a in adapters if a[0].name in ("tiny_turbo_4step.safetensors", "native_larry_mixed_rank.safetensors")]
    payload = json.dumps([{"source": s.source, "weight_name": s.weight_name} for _, s in pair[:2]])  # 2 per job
    with running_app(backend) as url:
        client = Client(url, download_files=str(tmp_path), verbose=False)
        try:
            for demo, settings in adapters:
                info = client.predict(source=settings.source, weight_name=settings.weight_name or "",
                                      api_name="/inspect")
                assert facts(info["resolved"]) == expected(demo), f"API /inspect: {demo.name}"
            _, result = client.predict(prompt="a red ball", seed=0, steps=2, duration=5, height=16, width=16,
                                       adapters_json=payload, api_name="/generate")
        finally:
            client.close()
    assert len(result["adapters"]) == 2
    for (demo, _), shown in zip(pair, result["adapters"]):
        assert facts(shown["resolved"]) == expected(demo), f"API /generate: {demo.name}"
