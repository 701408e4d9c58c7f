"""The whole Gradio app, assembled from tabs. Takes a backend object; holds no model logic."""

from __future__ import annotations

from typing import Any

import gradio as gr

from .generate_tab import build_generate_tab

TITLE = "H3 LoRA Lab"
INTRO = ("Inspect, apply and compare LoRA adapters on **MiniMax H3** (video + stereo audio). "
         "Model: `{model}`.")


def build_app(backend: Any) -> gr.Blocks:
    """``backend`` offers ``model_name`` and ``generate(prompt, seed, steps, duration, on_step) -> dict``."""
    with gr.Blocks(title=TITLE) as demo:
        gr.Markdown(f"# {TITLE}\n" + INTRO.format(model=backend.model_name))
        with gr.Tab("Generate"):
            build_generate_tab(backend.generate)
    demo.queue(default_concurrency_limit=1, max_size=32)
    return demo
