"""Kept only so that ``generate_events.py`` (issue 40's file) imports unchanged: the check lives in the Gradio door,
``h3app.ui.gradio_compat.client_gone``."""

from .gradio_compat import client_gone

__all__ = ["client_gone"]
