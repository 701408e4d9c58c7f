"""The suite's own conventions (tests/conftest.py, "How the suite is put together"), checked on its source: helper
modules imported once by their bare name, shared fixtures never imported, every test asserting something itself,
every poll with a deadline, files and tests named for behaviour, and one browser per session."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent


@functools.cache
def parsed() -> dict[Path, ast.Module]:
    """Every module of tests/, parsed once per session (read only by the scans)."""
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(TESTS.glob("*.py"))}


def called_name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def asserts_itself(test: ast.AST) -> bool:
    """An ``assert``, ``pytest.raises``/``warns``/``fail``, Playwright's ``expect``, or an ``assert_*`` helper."""
    for node in ast.walk(test):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Call) and (called_name(node).startswith(("assert", "expect"))
                                           or called_name(node) in ("raises", "warns", "fail")):
            return True
    return False


def test_helper_modules_are_imported_by_their_bare_name_only() -> None:
    found = [f"{path.name}:{node.lineno}" for path, tree in parsed().items() for node in ast.walk(tree)
             if (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tests")
             or (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "tests" for a in node.names))]
    assert found == [], f"`tests.<module>` loads a second copy of a module pytest already loaded: {found}"


def test_no_fixture_is_imported_by_name() -> None:
    trees = parsed()
    fixtures = {path.stem: {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                            and any("fixture" in ast.unparse(d) for d in node.decorator_list)}
                for path, tree in trees.items()}
    assert "fake_hub" in fixtures["hub_server"], "the fixture scan is broken"
    found = [f"{path.name}:{node.lineno} {alias.name}" for path, tree in trees.items() for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.module in fixtures
             for alias in node.names if alias.name in fixtures[node.module]]
    assert found == [], f"shared fixtures belong in a plugin (tests/conftest.py's pytest_plugins): {found}"


def test_every_test_asserts_something_itself() -> None:
    silent = [f"{path.name}::{node.name}" for path, tree in parsed().items() if path.name.startswith("test_")
              for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
              and not asserts_itself(node)]
    assert silent == []


def test_every_poll_has_a_deadline() -> None:
    """A ``while`` loop that sleeps or waits must name a deadline (or call ``polling.wait_until``, which has one)."""
    waits = ("sleep", "wait_for_change", "wait_for_timeout", "wait")
    found = []
    for path, tree in parsed().items():
        for loop in (node for node in ast.walk(tree) if isinstance(node, ast.While)):
            waiting = any(isinstance(node, ast.Call) and called_name(node) in waits for node in ast.walk(loop))
            if waiting and "deadline" not in ast.unparse(loop):
                found.append(f"{path.name}:{loop.lineno}")
    assert found == [], f"polls without a deadline (use polling.wait_until): {found}"


def test_files_and_tests_are_named_for_behaviour() -> None:
    """Not for history: no issue numbers (``test_ui_issue22.py``) and no numbered steps (``test_1_…``)."""
    history = re.compile(r"issue|^test_\d+_")
    found = [path.name for path in parsed() if history.search(path.stem)]
    found += [f"{path.name}::{node.name}" for path, tree in parsed().items() for node in ast.walk(tree)
              if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and history.search(node.name)]
    assert found == [], f"name a file or test for the behaviour it holds: {found}"


def test_browser_tests_share_the_sessions_browser_and_say_so() -> None:
    """Chromium is started once, by the ``browser`` plugin (tests/browser_fixtures.py); no module defines its own
    ``app``/``browser``/``page`` fixture (a second app and browser beside the shared ones); a module driving the
    browser is marked ``browser`` and ``slow``."""
    launches, shadows, unmarked = [], [], []
    for path, tree in parsed().items():
        if path.name == "browser_fixtures.py":
            continue
        launches += [f"{path.name}:{node.lineno}" for node in ast.walk(tree)
                     if isinstance(node, ast.Call) and called_name(node) == "chromium"]
        shadows += [f"{path.name}::{node.name}" for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                    and node.name in ("app", "browser", "page")
                    and any("fixture" in ast.unparse(d) for d in node.decorator_list)]
        drives = any(isinstance(node, ast.arg) and node.arg in ("browser", "page") for node in ast.walk(tree))
        source = ast.unparse(tree)
        if path.name.startswith("test_") and drives and not ("mark.browser" in source and "mark.slow" in source):
            unmarked.append(path.name)
    assert launches == [], f"chromium started outside the session's browser fixture: {launches}"
    assert shadows == [], f"use the session's app/browser/page (tests/browser_fixtures.py): {shadows}"
    assert unmarked == [], f"browser tests are marked browser and slow: {unmarked}"


def test_the_scans_find_what_they_look_for() -> None:
    silent = ast.parse("def test_x():\n    run()\n").body[0]
    loud = ast.parse("def test_y():\n    with pytest.raises(E):\n        run()\n").body[0]
    assert not asserts_itself(silent) and asserts_itself(loud)
