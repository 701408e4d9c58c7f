"""The package rules of docs/architecture.md, checked on the source: what each package may import, ``h3app/rules``
and ``h3app/lru.py`` neutral (nothing heavy, no other h3app package), and the commands' parsers light (``--help`` and
argument errors load no torch)."""

from __future__ import annotations

import ast
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
    "model": {"errors", "lru", "rules"},
    "adapters": {"errors", "lru", "rules", "settings"},
    "lora": {"adapters", "errors", "lru", "rules", "settings"},
    "parallel": {"errors", "model", "rules"},
    "backend": {"adapters", "errors", "lora", "model", "rules", "settings"},
    "ui": {"adapters", "backend", "errors", "rules", "settings"},
    "hardware": {"adapters", "backend", "errors", "lora", "model", "rules", "settings"},
}


def imported_packages(package: str) -> dict[str, list[str]]:
    """h3app package imported → the files (and lines) of ``package`` that import it, lazy imports included."""
    files = [H3APP / f"{package}.py"] if (H3APP / f"{package}.py").exists() else sorted((H3APP / package).rglob("*.py"))
    found: dict[str, list[str]] = {}
    for path in files:
        parts = path.relative_to(H3APP).with_suffix("").parts
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
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
                if name != package:
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


@pytest.mark.parametrize("argv, status", [(["generate", "--help"], 0), (["check", "--help"], 0), (["grid", "--help"], 0),
                                          (["generate", "--prompt", "x"], 2), (["check", "--steps", "many"], 2)])
def test_command_help_and_argument_errors_load_no_torch(argv: list[str], status: int) -> None:
    code = ("import sys\nfrom h3app.cli import main\ntry:\n    main(" + repr(argv) + ")\nexcept SystemExit as done:\n"
            "    print(done.code, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=H3APP.parent, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == f"{status} False", (done.stdout, done.stderr)


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
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
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


def test_workflow_names_are_written_once() -> None:
    """``"t2va"``, ``"fl2va"`` and ``"ref2va"`` are string literals only in ``rules/choices.py``; every other module
    imports the constants (a typo in a literal would silently pick no workflow)."""
    import io
    import tokenize

    names = {'"t2va"', "'t2va'", '"fl2va"', "'fl2va'", '"ref2va"', "'ref2va'"}
    found = []
    for path in sorted(H3APP.rglob("*.py")):
        if path.relative_to(H3APP).as_posix() == "rules/choices.py":
            continue
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if token.type == tokenize.STRING and token.string in names:
                found.append(f"{path.relative_to(H3APP.parent)}:{token.start[0]}")
    assert found == []
