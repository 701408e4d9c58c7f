"""Test-wide settings and isolation: nothing from the internet, no analytics, and no state shared between tests.

- Every test gets its own, empty Hugging Face home (``private_hf_home``): the environment and every import-time copy
  of a home-derived path (``tests/hf_home.py``), so no test sees another's cache and the user's cache is never used;
  and a new huggingface_hub HTTP client (no keep-alive connection to an earlier test's stand-in Hub).
- The session's tiny model is loaded once; after each test that used it, backends are reset and the weights are
  checked bit for bit against the model as loaded (``tests/model_state.py``), else that test fails.

How the suite is put together (tests/test_suite_rules.py checks the first four):

1. Helper modules in ``tests/`` are imported by their bare name (``from hub_server import FakeHub``): pytest puts
   ``tests/`` on ``sys.path``. Never ``tests.hub_server``: that loads a second copy of the module.
2. A fixture shared by several modules lives in a plugin module listed in ``pytest_plugins`` below (``fake_hub``,
   ``at_base``, the browser tests' ``app``/``browser``/``page``, the tiny rehearsal ``tiny_rank4_measured``). Tests
   ask for it by parameter name and never import it (ruff's F811 flags an imported fixture shadowed by a
   parameter). A new shared fixture: add it to one of those modules, or add a module to the list. A fixture only
   one module needs stays in that module.
3. Every test asserts something itself (``assert``, ``pytest.raises``, Playwright's ``expect``, an ``assert_*``
   helper), and every poll has a deadline: ``polling.wait_until(condition, what)``, never a bare
   ``while …: sleep``.
4. A property test (hypothesis) that may be refused asserts a share of accepted examples (``accepted_share.Share``).
5. Each test has pytest-timeout's limit (``timeout`` in pytest.ini); one that may need longer says so with
   ``@pytest.mark.timeout(SECONDS)``. A test over a few seconds is ``@pytest.mark.slow`` (the quick subset,
   ``-m "not slow"``, leaves it out); a browser test is also ``@pytest.mark.browser``.
6. Expensive things are shared: the session's ``tiny_model`` (never load another model unless the test is about
   loading), a module's ``backend``, the session's one app and chromium. ``scripts/test.sh`` runs two worker
   processes (pytest-xdist, ``--dist loadfile``): a session fixture is built once per worker, a module fixture once
   (a file's tests stay on one worker), and nothing may rely on another file's tests running in the same process. Call the CLI in-process
   (``cli_runner.run_cli``) unless the test is about the process itself (exit status, stderr, what it imports).
"""

import os
import tempfile

from hf_home import isolate_process_environment

# Before huggingface_hub/gradio are imported anywhere (they read these at import time).
isolate_process_environment()
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"

# Fixture modules shared by the whole suite (convention 2 above): light at import, heavy imports inside fixtures.
pytest_plugins = ["hub_server", "model_state", "browser_fixtures", "rehearsal_fixtures", "file_order"]

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

import pytest  # noqa: E402
from hf_home import use_hf_home  # noqa: E402

if TYPE_CHECKING:
    from model_state import ModelGuard


@pytest.fixture(scope="session")
def _hf_homes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder that holds every test's Hugging Face home."""
    return tmp_path_factory.mktemp("hf_homes")


@pytest.fixture(autouse=True)
def private_hf_home(_hf_homes: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own, empty Hugging Face home (``fake_hub`` moves it again, under the test's ``tmp_path``).
    ``mkdtemp``, not ``tmp_path_factory.mktemp``: that lists every earlier numbered folder to number the next one,
    a cost that grows with each test."""
    return use_hf_home(monkeypatch, tempfile.mkdtemp(prefix="home-", dir=_hf_homes))


@pytest.fixture(scope="session")
def _model_guard() -> Iterator["ModelGuard"]:
    """The embedded tiny checkpoint, both partitions loaded, with a bitwise copy of its weights."""
    from model_state import ModelGuard

    from h3app.model.loader import load_model

    model = load_model("tiny", "t2va")
    model.transformer("ref2va")  # loaded now, so that its base is the checkpoint's
    guard = ModelGuard(model)
    yield guard
    guard.close()


@pytest.fixture(scope="session")
def tiny_model(_model_guard):
    """The embedded tiny checkpoint, loaded once for the whole session (both transformer partitions).

    Shared: every test that uses it must leave it bitwise as loaded once backends are reset (``_session_model_at_base``)."""
    return _model_guard.model


@pytest.fixture(autouse=True)
def _session_model_at_base(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used ``tiny_model``: reset backends on it and fail the test unless it is bitwise as loaded."""
    guard = request.getfixturevalue("_model_guard") if "tiny_model" in request.fixturenames else None
    yield
    if guard is not None:
        guard.check_after(request.node.nodeid)


@pytest.fixture(scope="module")
def backend(tiny_model, tmp_path_factory: pytest.TempPathFactory):
    """A backend on the session's tiny model with its own output folder; reset and closed after the module.
    A test module that needs another kind of backend defines its own ``backend`` fixture."""
    from h3app.backend.service import Backend

    service = Backend(loaded=tiny_model, output_dir=tmp_path_factory.mktemp("outputs"))
    yield service
    service.binder.reset()
    service.close()


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bad-input corpus (tests/bad_inputs.py) written once per module."""
    from bad_inputs import make_corpus

    folder = tmp_path_factory.mktemp("bad_inputs")
    make_corpus(folder)
    return folder


def pytest_unconfigure(config: pytest.Config) -> None:
    """After the last summary line (where CI's tail of the output shows it): a failed random-order run's seed, with
    the command that replays that order."""
    seed = getattr(config.option, "randomly_seed", None)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    session_failed = getattr(reporter, "stats", {}).get("failed") or getattr(reporter, "stats", {}).get("error")
    if isinstance(seed, int) and reporter is not None and session_failed:
        reporter.write_line(f"random order seed {seed}: replay with "
                            f"bash scripts/test.sh -p randomly --randomly-seed={seed} -n 0")
