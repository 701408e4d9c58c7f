"""The one way an event shows a refusal: the backend's one-line message as Gradio's error modal."""

import gradio as gr

from ..errors import H3AppError


def user_error(error: H3AppError) -> gr.Error:
    """The backend's one-line message as a Gradio error modal (never a traceback)."""
    return gr.Error(str(error), print_exception=False)
