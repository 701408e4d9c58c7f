"""README's table of environment variables lists every variable h3app reads: a name read in the code (a literal
``H3APP_*`` name, or any name read through ``os.environ``/``os.getenv``) is a row of the table, and every ``H3APP_*``
row is read somewhere."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
SOURCES = [*sorted((TOP / "h3app").rglob("*.py")), TOP / "app.py"]
# Read by the code but no setting of a person's: torchrun's rank variables, and the leader's pid app.py hands the
# ranks it starts itself (docs/multi-gpu.md).
NOT_SETTINGS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "H3APP_PARALLEL_LEADER_PID"}


def readme_rows() -> set[str]:
    """The names in the first cell of each row of README's variable table."""
    text = (TOP / "README.md").read_text()
    table = text.split("| variable | meaning |", 1)[1].split("\n\n", 1)[0]
    return {name for line in table.splitlines() if line.startswith("| `")
            for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split(" | ", 1)[0])}


def _constants(trees: list[ast.AST]) -> dict[str, str]:
    """Module-level ``NAME = "TEXT"`` of every module (an env name is often kept in a constant)."""
    found: dict[str, str] = {}
    for tree in trees:
        for node in getattr(tree, "body", []):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str):
                found.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return found


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


@functools.cache
def read_names() -> frozenset[str]:
    """Every variable name the code reads: literal ``H3APP_*`` names, and the names read from ``os.environ`` (the
    sources parsed once per session: three tests ask)."""
    trees = [ast.parse(path.read_text(), str(path)) for path in SOURCES]
    constants = _constants(trees)

    def name_of(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return constants.get(node.id) if isinstance(node, ast.Name) else None

    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.fullmatch(r"H3APP_[A-Z0-9_]+", node.value):
                names.add(node.value)
            elif isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute) and (
                    node.func.attr == "get" and _is_environ(node.func.value) or node.func.attr == "getenv"):
                names.add(name_of(node.args[0]) or "")
            elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
                names.add(name_of(node.slice) or "")
            elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
                names.add(name_of(node.left) or "")
    return frozenset(names - {""})


def test_the_scan_finds_names_read_from_the_environment():
    names = read_names()
    assert {"H3APP_MAX_UPLOAD_CACHE_GB", "H3APP_MAX_UPLOADS_GB", "SPACE_ID", "FORWARDED_ALLOW_IPS", "HF_TOKEN",
            "WORLD_SIZE"} <= names


def test_readme_lists_every_variable_the_code_reads():
    missing = read_names() - NOT_SETTINGS - readme_rows()
    assert missing == set(), f"add these to README.md's table of environment variables: {sorted(missing)}"


def test_every_h3app_variable_in_the_readme_is_read():
    unread = {name for name in readme_rows() if name.startswith("H3APP_")} - read_names()
    assert unread == set(), f"README.md lists variables nothing reads: {sorted(unread)}"
