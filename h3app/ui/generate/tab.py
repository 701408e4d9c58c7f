"""Layout of the request controls (shared by Generate, Equivalence and Grid) and of the Generate tab."""

from __future__ import annotations

from dataclasses import dataclass, field

import gradio as gr

from ...backend.limits import MAX_STEPS, Limits
from ...rules.choices import T2VA, WORKFLOWS
from ...rules.request_defaults import TINY_DEFAULTS, RequestDefaults
from ...rules.values import MAX_SEED, MIN_SEED
from ..presenters import render
from ..unclamped import unclamped
from .events import APPLY_NOTE_EMPTY, steps_note
from .preview_stream import build_generate_preview
from .time_note import TIME_NOTE_ID

STEPS_HELP = "N steps run the model N−1 times (the schedule's last point is a step too)."


@dataclass
class RequestControls:
    workflow: gr.Radio
    first_frame: gr.Image
    last_frame: gr.Image
    keyframes: gr.Row
    references: gr.File
    prompt: gr.Textbox
    trigger_button: gr.Button
    seed: gr.Number
    randomize: gr.Checkbox
    steps: gr.Slider
    steps_note: gr.Markdown
    duration: gr.Slider
    height: gr.Number
    width: gr.Number
    shift: gr.Number
    audio_shift: gr.Number
    time_note: gr.Markdown  # the predicted time (and $) of this request on this box (time_note.py)
    cache: gr.Checkbox  # the step cache (--cache fbc)
    samples: list[gr.Button] = field(default_factory=list)  # one click puts a prompt the model knows in the box


CACHE_HELP = ("faster: a step whose start barely changed skips the rest of the model and reuses its last result; the "
              "adapter stays exact, and A and B skip the same steps. Off by default.")
UI_MAX_STEPS = MAX_STEPS  # the slider's top is the rule's (Limits.max_steps, fewer on a hosted server)


def duration_step(limits: Limits) -> float:
    """The Duration slider's step (s): 3 frames, so that both ends of the accepted range are on its grid."""
    return 3 / limits.frames.fps


def build_request_controls(limits: Limits, defaults: RequestDefaults = TINY_DEFAULTS) -> RequestControls:
    """Workflow, keyframes/references, prompt, seed, steps, duration, canvas and shifts; every range from the held
    model's ``limits`` (read from its pipeline, held to what the box fits), every value from its ``defaults``."""
    with gr.Group(elem_classes=["h3-panel"]):
        workflow = gr.Radio(list(WORKFLOWS), value=T2VA, label="Workflow", elem_id="workflow",
                            info="t2va: text → video + audio · fl2va: first/last keyframes · ref2va: references")
        with gr.Row(visible=False) as keyframes:
            first_frame = gr.Image(label="First keyframe", type="filepath", height=140, sources=["upload"])
            last_frame = gr.Image(label="Last keyframe", type="filepath", height=140, sources=["upload"])
        references = gr.File(label="References (images, videos, audio)", file_count="multiple", visible=False,
                             file_types=["image", "video", "audio"])
        with gr.Row(equal_height=True):
            prompt = gr.Textbox(label="Prompt", value=defaults.prompt, lines=2, scale=5, elem_id="prompt")
            trigger_button = gr.Button("Add trigger word", visible=False, size="sm", scale=1)
        samples = sample_prompts(defaults)
        with gr.Row(equal_height=True):
            seed = gr.Number(label="Seed", value=defaults.seed, precision=0, minimum=0, elem_id="seed")
            randomize = gr.Checkbox(label="Randomise seed (written back)", value=False)
            steps = gr.Slider(limits.min_steps, min(UI_MAX_STEPS, limits.max_steps), value=defaults.steps, step=1, label="Steps",
                              info=STEPS_HELP, elem_id="steps")
            rule = limits.frames
            duration = gr.Slider(rule.shortest_seconds, rule.longest_seconds, value=defaults.duration,
                                 step=duration_step(limits), label="Duration (s)", elem_id="duration",
                                 info=f"{rule.describe()}")
        note = gr.Markdown(steps_note(defaults.steps, None), elem_classes=["h3-note"])
        time = gr.Markdown("", elem_id=TIME_NOTE_ID, elem_classes=["h3-note"])
        cache = gr.Checkbox(label="Step cache (first-block cache)", value=False, elem_id="cache", info=CACHE_HELP)
        with gr.Accordion("Canvas and flow shifts (0 = model default)", open=False):
            with gr.Row():
                canvas = (f"a multiple of {limits.canvas_multiple}; height × width at most {limits.max_pixels:,} "
                          f"pixels")
                height = gr.Number(label="Height (px)", value=None, precision=0, minimum=0,
                                   step=limits.canvas_multiple, info=canvas, elem_id="height")
                width = gr.Number(label="Width (px)", value=None, precision=0, minimum=0,
                                  step=limits.canvas_multiple, elem_id="width")
                shift = gr.Number(label="Video shift", value=None, minimum=0)
                audio_shift = gr.Number(label="Audio shift", value=None, minimum=0)
    return RequestControls(workflow, first_frame, last_frame, keyframes, references, prompt, trigger_button, seed,
                           randomize, steps, note, duration, height, width, shift, audio_shift, time, cache, samples)


def sample_prompts(defaults: RequestDefaults) -> list[gr.Button]:
    """The line on what prompts the model knows and one button per sample prompt (none for a model that takes
    any prompt); each button's label is the prompt it puts in the box (``app_ui._wire_request``)."""
    if not defaults.knows:
        return []
    gr.Markdown(defaults.knows, elem_id="prompt-knows", elem_classes=["h3-note"])
    with gr.Row(elem_id="sample-prompts"):
        return [gr.Button(text, size="sm", variant="secondary", min_width=160, elem_classes=["h3-sample"])
                for text in defaults.sample_prompts]


NUMBER_FIELDS = ("seed", "steps", "duration", "height", "width", "shift", "audio_shift")  # the request's numbers


def bind_limits(controls: RequestControls, limits: Limits) -> RequestControls:
    """Give each of the request's numbers the ends of the rule that checks it — seed: ``GenerationRequest``'s
    0…``MAX_SEED``; steps, duration and canvas: the held model's ``limits`` (a side at most ``max_pixels`` ÷
    ``canvas_multiple``; 0 = the model's own) — and let typed values through unclamped (``ui/unclamped.py``): a value
    outside is refused in one line (``generate.events.request_note``), never clamped."""
    rule = limits.frames
    side = limits.max_pixels // limits.canvas_multiple
    for name, low, high in (("seed", MIN_SEED, MAX_SEED), ("steps", limits.min_steps, limits.max_steps),
                            ("duration", rule.shortest_seconds, rule.longest_seconds), ("height", 0, side),
                            ("width", 0, side), ("shift", 0, None), ("audio_shift", 0, None)):
        unclamped(getattr(controls, name), low, high)
    controls.steps_note.elem_id = "request-note"  # where a refused number is said (request_note)
    return controls


@dataclass
class GenerateTab:
    apply_note: gr.Markdown
    generate_button: gr.Button
    cancel_button: gr.Button
    cancel_note: gr.Markdown
    status: gr.Markdown
    video: gr.Video
    result_html: gr.HTML
    settings_json: gr.JSON
    settings_file: gr.File
    load_status: gr.Markdown
    h3app_command: gr.Code
    sglang_command: gr.Code
    sglang_notes: gr.HTML
    diffusers_snippet: gr.Code
    preview: gr.Image  # the step preview beside the video (preview_stream.py)
    preview_note: gr.Markdown
    step_preview: gr.Checkbox  # the "Step preview" toggle


def build_generate_tab() -> GenerateTab:
    """What the next run applies, Generate/Cancel, the video with its audio, and how to reproduce it."""
    apply_note = gr.Markdown(APPLY_NOTE_EMPTY, elem_id="apply-note", elem_classes=["h3-note"])
    with gr.Row():
        generate_button = gr.Button("Generate", variant="primary", scale=3, elem_id="generate")
        cancel_button = gr.Button("Cancel", variant="stop", scale=1, elem_id="cancel")
    cancel_note = gr.Markdown("", elem_id="generate-cancel-note")
    status = gr.Markdown("", elem_id="generate-status")
    with gr.Row():
        with gr.Column(scale=3):
            video = gr.Video(label="Result — video with stereo audio", interactive=False, height=300,
                             elem_id="video", autoplay=False)
        with gr.Column(scale=2):
            live, step_preview = build_generate_preview()
    result_html = gr.HTML(render.placeholder("The result, its seed and hash, and the alpha each adapter ran at "
                                             "appear here."), elem_id="result")
    with gr.Accordion("Reproduce: settings JSON, load settings, copy as CLI", open=False):
        settings_json = gr.JSON(label="Settings (with adapter commit and file sha256)", open=False,
                                elem_id="settings-json")
        with gr.Row():
            settings_file = gr.File(label="Load settings from a .json or an .mp4 made here",
                                    file_types=[".json", ".mp4"], height=90)
            load_status = gr.Markdown("")
        h3app_command = gr.Code(label="h3app CLI", language="shell", interactive=False, lines=3,
                                elem_id="h3app-command")
        sglang_command = gr.Code(label="sglang", language="shell", interactive=False, lines=3)
        sglang_notes = gr.HTML("")
        diffusers_snippet = gr.Code(label="diffusers", language="python", interactive=False, lines=6)
    return GenerateTab(apply_note, generate_button, cancel_button, cancel_note, status, video, result_html,
                       settings_json,
                       settings_file, load_status, h3app_command, sglang_command, sglang_notes, diffusers_snippet,
                       live.preview, live.preview_note, step_preview)
