"""The Generate tab: prompt, seed, steps, duration → video with stereo audio."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

import gradio as gr

from ..errors import H3AppError

STEPS_HELP = "num_inference_steps counts sigma points including the terminal one: N steps run N−1 evaluations."


def make_generate_fn(generate: Callable[..., dict[str, Any]]) -> Callable[..., tuple[str, dict[str, Any], int]]:
    """Wrap the backend's ``generate(prompt, seed, steps, duration, on_step) -> {"out": mp4, ...}`` as an event."""

    def on_generate(prompt: str, seed: float, randomize: bool, steps: float, duration: float,
                    progress: gr.Progress = gr.Progress()) -> tuple[str, dict[str, Any], int]:
        seed_value = random.randint(0, 2**31 - 1) if randomize else int(seed)

        def on_step(done: int, total: int) -> None:
            progress((done, total), desc=f"denoising step {done}/{total}")

        try:
            result = generate(prompt=prompt, seed=seed_value, steps=int(steps), duration=float(duration),
                              on_step=on_step)
        except H3AppError as error:
            raise gr.Error(str(error)) from error
        return str(Path(result["out"])), result, seed_value

    return on_generate


def build_generate_tab(generate: Callable[..., dict[str, Any]]) -> None:
    """Lay out the tab inside the current ``gr.Blocks`` context."""
    with gr.Row():
        with gr.Column(scale=1):
            prompt = gr.Textbox(label="Prompt", value="a red fox running through snow, wind howling", lines=3)
            with gr.Row():
                seed = gr.Number(label="Seed", value=7, precision=0)
                randomize = gr.Checkbox(label="Randomise seed", value=False)
            steps = gr.Slider(2, 60, value=5, step=1, label="Steps", info=STEPS_HELP)
            duration = gr.Slider(5, 15, value=5, step=1, label="Duration (s)")
            run = gr.Button("Generate", variant="primary")
        with gr.Column(scale=1):
            video = gr.Video(label="Video with stereo audio", autoplay=False)
            details = gr.JSON(label="Settings and hash")
    run.click(make_generate_fn(generate), [prompt, seed, randomize, steps, duration], [video, details, seed],
              api_name="generate", concurrency_id="gpu", concurrency_limit=1)
