"""Private APIs behind one door per library: diffusers' private names only in ``h3app/model/diffusers_compat.py``,
torch's only in ``h3app/model/torch_compat.py``, Gradio's only in ``h3app/ui/gradio_compat.py``; each door refuses,
in one line, a version of its library other than the one it was written for (requirements.txt's pin), and the app
meets that refusal at start-up."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from h3app.errors import H3AppError
from h3app.model import diffusers_compat, loader, torch_compat
from h3app.rules import versions
from h3app.ui import gradio_compat

TOP = Path(__file__).resolve().parents[1]
H3APP = TOP / "h3app"
DOORS = {"diffusers": diffusers_compat, "torch": torch_compat, "gradio": gradio_compat}
MODEL_DOORS = {diffusers_compat, torch_compat}  # the two every model load passes
LIBRARIES = tuple(DOORS)


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined_names(trees: list[ast.AST]) -> set[str]:
    """Every name h3app itself defines: functions, classes, variables, attributes it assigns, parameters."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return names


def _imported_modules(tree: ast.AST) -> dict[str, str]:
    """Name bound by an import → the top-level package it comes from (``dist`` → ``torch``, ``os`` → ``os``)."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                bound[alias.asname or alias.name] = node.module.split(".")[0]
    return bound


def _owned(receiver: ast.AST) -> bool:
    """``self`` or ``cls``: an object of h3app's own classes."""
    return isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def private_uses(tree: ast.AST, defined: set[str], *, other_objects: bool = True) -> list[int]:
    """Lines of ``tree`` that reach a private name of torch, diffusers or gradio:

    - an import of a private module or name of theirs (``torch._dynamo``, ``from x import _y``);
    - a private attribute on anything imported from them (``torch._C``, ``distributed_c10d._get_default_store``);
    - with ``other_objects``: a private attribute read on any other object (``model._cp_plan``, ``getattr(model,
      "_parallel_config")``, ``func._schema``) whose name h3app never defines, so it is some library's own; objects
      h3app owns (``self``, ``cls``) and the standard library's modules (``os._exit``) are not theirs.
    """
    imported = _imported_modules(tree)
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {node.lineno for a in node.names
                      if a.name.split(".")[0] in LIBRARIES and any(map(private, a.name.split(".")))}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in LIBRARIES:
            if any(map(private, node.module.split("."))) or any(private(a.name) for a in node.names):
                found.add(node.lineno)
        elif isinstance(node, ast.Attribute) and private(node.attr):
            library = imported.get(_root(node) or "")
            if library in LIBRARIES or other_objects and library is None and not _owned(node.value) \
                    and node.attr not in defined:
                found.add(node.lineno)
        elif other_objects and isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                and private(node.args[1].value) and node.args[1].value not in defined \
                and not _owned(node.args[0]) and _root(node.args[0]) not in imported:
            found.add(node.lineno)
    return sorted(found)


def test_the_scan_finds_every_kind_of_private_use():
    sample = '''import os
import torch
import torch.distributed as dist
from torch._subclasses import fake_tensor
from diffusers.models._modeling_parallel import gather_size_by_comm
from torch.distributed.distributed_c10d import _get_default_store
from torch.distributed import distributed_c10d
aten = torch.ops.aten
x = torch._C.TensorBase
y = distributed_c10d._get_default_store()
z = model._cp_plan
w = getattr(model, "_parallel_config", None)
v = aten._to_copy.default
u = self.transformer._keep_in_fp32_modules
ok = (self._mine, cls._ours, os._exit, own._defined_here, dist.all_gather, getattr(self, "_mine"))
own._defined_here = 1
'''
    tree = ast.parse(sample)
    assert private_uses(tree, defined_names([tree])) == [4, 5, 6, 9, 10, 11, 12, 13, 14]
    assert private_uses(tree, defined_names([tree]), other_objects=False) == [4, 5, 6, 9, 10]


def test_private_names_of_torch_diffusers_and_gradio_live_only_in_their_doors():
    files = [*sorted(H3APP.rglob("*.py")), TOP / "app.py"]
    trees = {path: ast.parse(path.read_text(), str(path)) for path in files}
    defined = defined_names(list(trees.values()))
    doors = {Path(door.__file__).resolve() for door in DOORS.values()}
    found = [f"{path.relative_to(TOP)}:{line}" for path, tree in trees.items() if path.resolve() not in doors
             for line in private_uses(tree, defined)]
    assert found == [], "use h3app/model/diffusers_compat.py, torch_compat.py or ui/gradio_compat.py (or a public API)"
    in_doors = {name: private_uses(ast.parse(Path(door.__file__).read_text()), defined) for name, door in DOORS.items()}
    assert all(in_doors.values()), f"a door with no private use left is not needed: {in_doors}"


def test_each_door_is_written_for_the_pinned_version():
    pins = dict(re.findall(r"^(torch|diffusers|gradio)==([\w.]+)", (TOP / "requirements.txt").read_text(), re.MULTILINE))
    assert {name: door.WRITTEN_FOR for name, door in DOORS.items()} == pins
    assert {name: versions.release(versions.installed(name)) for name in DOORS} == pins  # this environment


def test_a_local_build_label_is_the_same_release():
    versions.check_written_for("torch", versions.release(torch.__version__), "the door")
    assert versions.release("2.14.1+cu130") == versions.release("2.14.1+cpu") == "2.14.1"


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("other", ["0.43.0", "2.14.1a0", "none"])
def test_a_door_refuses_another_version_at_import_in_one_line(monkeypatch, library, other):
    door = DOORS[library]
    real = versions.installed
    monkeypatch.setattr(versions, "installed", lambda name: other if name == library else real(name))
    with pytest.raises(H3AppError) as refused:
        importlib.reload(door)
    message = str(refused.value)
    assert "\n" not in message
    assert all(word in message for word in (door.__name__, f"{library} {other}", f"{library}=={door.WRITTEN_FOR}"))


def test_every_model_load_passes_through_both_model_doors():
    assert set(loader.PRIVATE_API_DOORS) == MODEL_DOORS


@pytest.mark.slow
def test_the_app_refuses_another_diffusers_at_start_up_in_one_line():
    fake = ("import importlib.metadata as m, runpy, sys\nreal = m.version\n"
            "m.version = lambda name: '0.43.0' if name == 'diffusers' else real(name)\n"
            "sys.argv = ['app.py', '--model', 'tiny']\nrunpy.run_path('app.py', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", fake], cwd=TOP, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: h3app.model.diffusers_compat uses private parts of diffusers 0.42.1")


def test_the_doors_work_on_the_pinned_versions():
    """Each private name the doors wrap exists and means what they say on these versions (dynamo's counters:
    tests/test_compile.py)."""
    from diffusers import MiniMaxH3Transformer3DModel

    plan = diffusers_compat.context_parallel_plan(MiniMaxH3Transformer3DModel)
    assert {"proj_out", "audio_proj_out"} <= set(plan)
    assert not diffusers_compat.is_parallel(torch.nn.Linear(1, 1))
    assert isinstance(diffusers_compat.fp32_modules(MiniMaxH3Transformer3DModel), tuple)
    written = [a.alias_info is not None and a.alias_info.is_write
               for a in torch_compat.op_arguments(torch.ops.aten.add_.Tensor)]
    assert written[:2] == [True, False]
    with torch_compat.FakeTensorMode():
        assert isinstance(torch.empty(2), torch_compat.FakeTensor)


def test_gradios_private_names_appear_in_no_module_but_its_door():
    words = re.compile(r"(?<![A-Za-z0-9])_queue\b|gradio\.queueing|gradio\.context|LocalContext|\.fns\b|pending_messages"
                       r"|event_ids_to_events|remove_from_queue")
    door = Path(gradio_compat.__file__).resolve()
    found = {str(path.relative_to(TOP)) for path in [*H3APP.rglob("*.py"), TOP / "app.py"]
             if words.search(path.read_text()) and path.resolve() != door}
    assert found == set()
    assert words.search(door.read_text())


def test_the_gradio_door_works_on_the_pinned_version():
    import gradio as gr

    with gr.Blocks() as demo:
        box = gr.Textbox()
        gr.Button().click(lambda: "x", None, box, api_name="x")
        box.change(lambda: None, None, None, queue=False, api_name="y")
    events = list(gradio_compat.event_functions(demo))
    assert [(e.api_name, e.queued) for e in events] == [("x", True), ("y", False)]
    gradio_compat.wrap_events(demo, lambda event: lambda: f"wrapped {event.api_name}")
    gradio_compat.wrap_events(demo, lambda event: lambda: "twice")  # wrapped once only
    assert [e.fn() for e in gradio_compat.event_functions(demo)] == ["wrapped x", "wrapped y"]
    demo.queue()
    gradio_compat.hook_queue(demo)
    assert gradio_compat.client_gone() is None and gradio_compat.current_request() is None  # outside an event


@pytest.mark.slow
def test_the_app_refuses_another_gradio_at_start_up_in_one_line():
    fake = ("import importlib.metadata as m, runpy, sys\nreal = m.version\n"
            "m.version = lambda name: '6.32.0' if name == 'gradio' else real(name)\n"
            "sys.argv = ['app.py', '--model', 'tiny']\nrunpy.run_path('app.py', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", fake], cwd=TOP, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: h3app.ui.gradio_compat uses private parts of gradio 6.31.0")
