"""Test-wide settings: nothing from the internet, no analytics, a private HF cache per session."""

import os
import tempfile

# Set before huggingface_hub/gradio are imported anywhere (they read these at import time).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="h3app-test-hf-home-"))
os.environ.pop("HF_TOKEN", None)

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model():
    """The embedded tiny checkpoint, loaded once for the whole session (t2va components)."""
    from h3app.model.loader import load_model

    return load_model("tiny", "t2va")
