"""The one way an event shows a refusal: the backend's one-line message as Gradio's error modal."""

import gradio as gr

from ..errors import H3AppError
from .presenters.visitor_words import visitor_text


def user_error(error: H3AppError) -> gr.Error:
    """The backend's one-line message, in a page visitor's words (``visitor_text``: controls, not flags), as a
    Gradio error (never a traceback)."""
    return gr.Error(visitor_text(str(error)), print_exception=False)
