"""The app's step-cache checkbox: the request it makes, its predicted time, its settings file and its CLI line."""

from __future__ import annotations

from h3app.rules.choices import FIRST_BLOCK_CACHE, NO_CACHE
from h3app.rules.frames import RELEASED
from h3app.ui.forms import RequestForm
from h3app.ui.generate.settings_file import settings_to_controls
from h3app.ui.generate.time_note import predicted_for
from h3app.ui.presenters.snippets import h3app_command


class Limits:
    """Limits that refuse no canvas and no step count (the duration by the released rule)."""

    frames = RELEASED
    check_canvas = check_steps = staticmethod(lambda *values: None)


def test_the_checkbox_makes_a_cached_request_and_off_is_the_default():
    assert RequestForm(prompt="x").to_request().cache == NO_CACHE
    assert RequestForm(prompt="x", cache=True).to_request().cache == FIRST_BLOCK_CACHE


def test_the_predicted_time_is_asked_for_the_cached_request():
    asked = []
    predicted_for(RequestForm(prompt="", cache=True), Limits(), asked.append)
    predicted_for(RequestForm(prompt=""), Limits(), asked.append)
    assert [request.cache for request in asked] == [FIRST_BLOCK_CACHE, NO_CACHE]


def test_a_cached_runs_settings_restore_the_checkbox_and_copy_as_cli_says_it():
    request = RequestForm(prompt="a fox", cache=True).to_request().to_json()
    settings = {"model": "tiny", "request": request, "adapters": []}
    assert settings_to_controls(settings)["cache"] is True
    assert f"--cache {FIRST_BLOCK_CACHE}" in h3app_command(settings)
    plain = {"model": "tiny", "request": RequestForm(prompt="a fox").to_request().to_json(), "adapters": []}
    assert settings_to_controls(plain)["cache"] is False and "--cache" not in h3app_command(plain)
