"""The package rules of docs/architecture.md, checked on the source: what each package may import, ``h3app/rules``
and ``h3app/lru.py`` neutral (nothing heavy, no other h3app package), and the commands' parsers light (``--help``,
argument errors and bad flag values load no torch)."""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

H3APP = Path(__file__).resolve().parents[1] / "h3app"

# package → the h3app packages it may import (docs/architecture.md, "Packages, and what each may import").
ALLOWED: dict[str, set[str]] = {
    "rules": {"errors"},
    "lru": set(),
    "settings": {"errors", "rules"},
    "request": {"errors", "rules"},  # the generation request: a value the UI and the commands build without torch
    "model": {"errors", "lru", "rules"},
    "model/tiny_training": {"errors", "lora", "lru", "rules"},  # trains the demo LoRAs with the app's own layer
    "adapters": {"errors", "lru", "rules", "settings"},
    "lora": {"adapters", "errors", "lru", "rules", "settings"},
    "parallel": {"errors", "model", "rules"},
    "hosting": {"adapters", "errors", "rules"},  # admission, quotas and refusals of a public server
    "backend": {"adapters", "errors", "hosting", "lora", "model", "request", "rules", "settings"},
    "ui": {"adapters", "backend", "errors", "hosting", "lora", "lru", "request", "rules", "settings"},
    "hardware": {"adapters", "backend", "errors", "lora", "lru", "model", "request", "rules", "settings"},
}


def imported_packages(package: str) -> dict[str, list[str]]:
    """h3app package imported → the files (and lines) of ``package`` that import it, lazy imports included."""
    files = [H3APP / f"{package}.py"] if (H3APP / f"{package}.py").exists() else sorted((H3APP / package).rglob("*.py"))
    files = [f for f in files if not any(f.is_relative_to(H3APP / sub) for sub in ALLOWED if sub.startswith(f"{package}/"))]
    found: dict[str, list[str]] = {}
    for path in files:
        parts = path.relative_to(H3APP).with_suffix("").parts
        for node in ast.walk(parsed(path)):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolve against the module's own package
                    base = list(parts[:-1])[: len(parts) - node.level] if node.level > 1 else list(parts[:-1])
                    target = base + (node.module.split(".") if node.module else [])
                    if not target:  # ``from .. import x``: each name is a package or module of h3app
                        names = [alias.name for alias in node.names]
                    else:
                        names = [target[0]]
                elif node.module and node.module.split(".")[0] == "h3app":
                    names = [node.module.split(".")[1]] if "." in node.module else [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[1] for a in node.names if a.name.startswith("h3app.")]
            for name in names:
                if name != package.split("/")[0]:
                    found.setdefault(name, []).append(f"{path.relative_to(H3APP.parent)}:{node.lineno}")
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_what_the_architecture_allows(package: str) -> None:
    imported = imported_packages(package)
    assert imported or package in ("rules", "errors", "lru"), f"no imports found for {package}: is the scan broken?"
    unexpected = {name: where for name, where in imported.items() if name not in ALLOWED[package]}
    assert unexpected == {}, f"h3app/{package} imports what docs/architecture.md does not allow: {unexpected}"


def test_nothing_below_the_entry_points_imports_the_ui_or_the_commands() -> None:
    for package in ALLOWED:
        imported = imported_packages(package)
        assert not {"ui", "commands", "cli"} & set(imported), (package, imported)


def test_the_scan_sees_relative_and_absolute_imports() -> None:
    imported = imported_packages("backend")
    assert {"adapters", "lora", "model", "errors"} <= set(imported)


def loaded_after_importing(modules: list[str]) -> str:
    """``"[heavy libraries loaded] [h3app packages loaded]"`` after importing ``modules`` in a fresh interpreter."""
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "heavy = sorted(m for m in ('torch', 'diffusers', 'transformers', 'gradio', 'safetensors', 'numpy')"
              " if m in sys.modules)\n"
            + "ours = sorted({m.split('.')[1] for m in sys.modules if m.startswith('h3app.')})\n"
            + "print(heavy, ours)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=H3APP.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_rules_is_neutral_and_torch_free() -> None:
    modules = sorted(f"h3app.rules.{p.stem}" for p in (H3APP / "rules").glob("*.py") if p.stem != "__init__")
    assert loaded_after_importing(modules) == "[] ['errors', 'rules']"


def test_the_lru_is_neutral_and_torch_free() -> None:
    assert loaded_after_importing(["h3app.lru"]) == "[] ['lru']"


def test_the_request_types_are_torch_free() -> None:
    """A generation request and an adapter's settings are values the UI's forms and the commands build before any
    model: importing them loads no torch (nor any heavy library) and no h3app package beyond the rules."""
    loaded = loaded_after_importing(["h3app.request", "h3app.settings"])
    assert loaded == "[] ['errors', 'request', 'rules', 'settings']"
    done = subprocess.run([sys.executable, "-c", "import sys\nfrom h3app.request import GenerationRequest\n"
                           "GenerationRequest('a red ball moving right over a grey floor, low soft hum').to_json()\n"
                           "print('torch' in sys.modules)"],
                          cwd=H3APP.parent, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr


# argv → (exit status, what its one stderr line names): --help, argparse's errors, and a bad value of each kind.
OUT = ["--out", "x.mp4"]
NO_TORCH_CASES = [
    (["generate", "--help"], 0, None), (["check", "--help"], 0, None), (["grid", "--help"], 0, None),
    (["generate", "--prompt", "x"], 2, "--out"), (["check", "--steps", "many"], 2, "--steps"),
    (["generate", "--prompt", "x", "--dtype", "float99", *OUT], 2, "unknown dtype 'float99'"),
    (["check", "--adapter", "a", "--dtype", "fp8"], 2, "unknown dtype 'fp8'"),
    (["generate", "--prompt", "x", "--duration", "40", *OUT], 2, "--duration must be between"),
    (["grid", "--adapter", "a", "--prompt", "x", "--duration", "1", "--out-dir", "g"], 2, "--duration must be"),
    (["generate", "--prompt", "x", "--out", "x.avi"], 2, "--out must end in .mp4"),
    (["generate", "--prompt", "x", "--adapter-spec", "alpha=3", *OUT], 2, "--adapter-spec must start with"),
    (["generate", "--prompt", "x", "--weight-name", "w.safetensors", *OUT], 2, "belong to --adapter"),
    (["check", "--adapter", "a", "--a", "8"], 2, "--a must be ALPHA:SCALE"),
    (["check", "--adapter", "a", "--b", "0:1"], 2, "--b alpha must be"),
    (["grid", "--adapter", "a", "--prompt", "x", "--seeds", "-1", "--out-dir", "g"], 2, "seed must be between 0"),
    (["grid", "--adapter", "a", "--prompt", "x", "--seeds", ",", "--out-dir", "g"], 2, "--seeds needs at least one"),
    (["generate", "--prompt", "x", "--steps", "1", *OUT], 2, "--steps must be between"),
    (["generate", "--prompt", "x", "--frames", "2000", *OUT], 2, "--frames must give"),
    (["generate", "--prompt", "x", "--height", "64", *OUT], 2, "give both --height and --width"),
    (["check", "--adapter", "a", "--preview-dir", "d"], 2, "--preview-dir needs --mode full"),
    (["plan", "--dtype", "fp99"], 2, "unknown dtype 'fp99'"),
    (["generate", "--prompt", "x", "--attention", "fast", *OUT], 2, "invalid choice: 'fast'"),
    (["check", "--adapter", "a", "--attention", "sage"], 2, "--attention sage is approximate"),
    (["search", "--limit", "many"], 2, "--limit"),
    (["generate", "--prompt", "x", "--adapter", "a", "--audio-strength", "loud", *OUT], 2, "audio strength must be"),
    (["check", "--adapter", "a", "--strength-schedule", "1,x"], 2, "strength schedule value must be"),
    (["grid", "--adapter", "a", "--prompt", "x", "--audio-strength", "0", "--lora-mode", "merged", "--out-dir", "g"],
     2, "needs --lora-mode unmerged"),
]


def test_command_help_and_bad_values_are_answered_before_torch_is_imported() -> None:
    """Every case in one fresh interpreter: its exit status, its one ``error:`` line, and torch still not loaded."""
    code = ("import contextlib, io, json, sys\nfrom h3app.cli import main\nseen = []\n"
            f"for argv in {[argv for argv, _, _ in NO_TORCH_CASES]!r}:\n"
            "    out, err = io.StringIO(), io.StringIO()\n"
            "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
            "        try:\n            status = main(argv)\n"
            "        except SystemExit as done:\n            status = done.code\n"
            "    seen.append([status, err.getvalue(), 'torch' in sys.modules])\n"
            "print(json.dumps(seen))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=H3APP.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for (argv, status, names), (code_seen, err, torch_loaded) in zip(NO_TORCH_CASES, json.loads(done.stdout),
                                                                    strict=True):
        assert (code_seen, torch_loaded) == (status, False), (argv, err)
        if names is not None:
            assert err.startswith("error: ") and err.count("\n") == 1 and names in err, (argv, err)


def module_imports(root: Path) -> dict[str, set[str]]:
    """Dotted module → the modules of the same tree it imports (lazy imports included; ``from pkg import mod``
    counts as importing ``pkg.mod`` when that is a module of the tree)."""
    top = root.parent
    modules = {".".join(p.relative_to(top).with_suffix("").parts).removesuffix(".__init__"): p
               for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(parsed(path)):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                stem = ".".join(base + ([node.module] if node.module else []))
                targets = [stem] + [f"{stem}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            edges |= {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
        graph[name] = edges
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while (member := stack.pop()) != node:
                group.append(member)
            group.append(node)
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_the_circle_finder_finds_a_circle() -> None:
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("tree", ["h3app", "bench"])
def test_no_module_imports_itself_through_others(tree: str) -> None:
    graph = module_imports(H3APP.parent / tree)
    assert len(graph) > 5, f"the scan found almost no modules in {tree}/"
    assert import_circles(graph) == []


@functools.cache
def parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once per session (the scans only read it)."""
    return ast.parse(path.read_text(), str(path))


def sources() -> list[Path]:
    """Every Python file of the product and its bench: ``h3app/``, ``bench/`` and ``app.py``."""
    top = H3APP.parent
    return [*sorted(H3APP.rglob("*.py")), *sorted((top / "bench").rglob("*.py")), top / "app.py"]


def vocabularies() -> dict[str, tuple[str, set[str]]]:
    """Vocabulary → (its home, relative to ``h3app/``; the strings only that home may spell out)."""
    from h3app.rules.alpha_source import AlphaSource
    from h3app.rules.choices import LORA_MODES, PARTITIONS, WORKFLOWS
    from h3app.rules.h3_modules import BLOCK_LINEARS, QKV

    return {
        "workflow": ("rules/choices.py", set(WORKFLOWS)),
        "partition": ("rules/choices.py", set(PARTITIONS)),
        "block linear": ("rules/h3_modules.py",  # as diffusers names them, and as PEFT's target_modules do
                         {*BLOCK_LINEARS, *QKV, *(name.removeprefix("attn.") for name in BLOCK_LINEARS)}),
        "alpha source": ("rules/alpha_source.py", {str(source) for source in AlphaSource}),
        "lora mode": ("rules/choices.py", set(LORA_MODES)),
    }


def spelled_out(tree: ast.AST, words: set[str]) -> list[int]:
    """Lines of ``tree`` where a string constant (f-strings' inner ones included) is one of ``words``."""
    return sorted(node.lineno for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in words)


def literal_fps(tree: ast.AST) -> list[int]:
    """Lines of ``tree`` that give a frame rate as a number: ``fps = 24``, ``FPS: int = 24``, ``fps=24`` in a call,
    ``{"fps": 24}``."""
    def number(value: ast.AST | None) -> bool:
        return isinstance(value, ast.Constant) and type(value.value) in (int, float)

    def fps(target: ast.AST) -> bool:
        name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""
        return name.lower() == "fps"

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and number(node.value) and any(fps(t) for t in node.targets) \
                or isinstance(node, ast.AnnAssign) and number(node.value) and fps(node.target) \
                or isinstance(node, ast.keyword) and node.arg and node.arg.lower() == "fps" and number(node.value):
            found.append(node.lineno)
        elif isinstance(node, ast.Dict):
            found += [key.lineno for key, value in zip(node.keys, node.values)
                      if isinstance(key, ast.Constant) and key.value == "fps" and number(value)]
    return sorted(found)


def test_the_vocabulary_scans_find_what_they_look_for() -> None:
    tree = ast.parse('run("t2va", fps=24)\nf"{x.get(\'w\', \'transformer_ref\')}"\nFPS = 24\nrow = {"fps": 25.0}\n')
    assert spelled_out(tree, {"t2va", "transformer_ref"}) == [1, 2]
    assert literal_fps(tree) == [1, 3, 4]


@pytest.mark.parametrize("vocabulary", ["workflow", "partition", "block linear", "alpha source", "lora mode"])
def test_each_vocabulary_is_written_once(vocabulary: str) -> None:
    """Workflow names, partition names, the block Linears' names, the alpha sources and the LoRA modes are string
    constants only in their home in ``h3app/rules``; every other module (bench included) imports them: a typo in a
    copy would silently match nothing."""
    home, words = vocabularies()[vocabulary]
    found = []
    for path in sources():
        if path == H3APP / home:
            continue
        lines = spelled_out(parsed(path), words)
        found += [f"{path.relative_to(H3APP.parent)}:{line}" for line in lines]
    assert found == []


def test_the_frame_rate_is_written_once() -> None:
    """A frame rate is a number only in ``rules/frames.py`` (``FPS``); everything else reads it from there."""
    found = []
    for path in sources():
        if path != H3APP / "rules/frames.py":
            found += [f"{path.relative_to(H3APP.parent)}:{line}" for line in literal_fps(parsed(path))]
    assert found == []


def process_wide_ignores(tree: ast.AST) -> list[int]:
    """Lines of ``tree`` that ignore warnings for the whole process: ``simplefilter("ignore")``, or
    ``filterwarnings("ignore", ...)`` naming neither the message nor the module; inside a ``catch_warnings()``
    block the filter ends with the block, so it is not one."""
    def catches(item: ast.withitem) -> bool:
        return isinstance(item.context_expr, ast.Call) and "catch_warnings" in ast.unparse(item.context_expr.func)

    scoped = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.With) and any(map(catches, node.items))
              for inner in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in scoped or not node.args \
                or not (isinstance(node.args[0], ast.Constant) and node.args[0].value == "ignore"):
            continue
        name = ast.unparse(node.func).rsplit(".", 1)[-1]
        narrowed = len(node.args) > 1 or any(k.arg in ("message", "module") for k in node.keywords)
        if name == "simplefilter" or name == "filterwarnings" and not narrowed:
            found.append(node.lineno)
    return sorted(found)


def test_the_warning_scan_finds_what_it_looks_for() -> None:
    tree = ast.parse('import warnings\nwarnings.simplefilter("ignore")\n'
                     'filterwarnings("ignore", category=UserWarning)\n'
                     'warnings.filterwarnings("ignore", category=UserWarning, module="torch")\n'
                     'with warnings.catch_warnings():\n    warnings.simplefilter("ignore")\n')
    assert process_wide_ignores(tree) == [2, 3]


def test_no_warning_is_ignored_process_wide() -> None:
    """Warnings are filtered by category and module (``cli.QUIET_MODULES``: the libraries' own), never for the whole
    process: h3app's own warnings, and any a person can act on, stay visible."""
    found = []
    for path in sources():
        found += [f"{path.relative_to(H3APP.parent)}:{line}" for line in process_wide_ignores(parsed(path))]
    assert found == []


MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def test_no_module_is_longer_than_450_lines() -> None:
    """In ``h3app/``, ``bench/`` and ``app.py``."""
    long = {str(path.relative_to(H3APP.parent)): lines for path in sources()
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_function_is_longer_than_80_lines() -> None:
    """Functions and methods, nested ones included, from ``def`` to their last line."""
    long = {}
    for path in sources():
        for node in ast.walk(parsed(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and (lines := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                long[f"{path.relative_to(H3APP.parent)}:{node.lineno} {node.name}"] = lines
    assert long == {}


def test_the_type_checker_covers_all_of_h3app():
    """CI's mypy (pyproject.toml) checks every package, the page's ui/, model/ and hardware/ included."""
    import tomllib

    settings = tomllib.loads((H3APP.parent / "pyproject.toml").read_text())["tool"]["mypy"]
    assert settings["files"] == ["h3app"]
    assert "mypy" in (H3APP.parent / ".ci" / "run").read_text()
