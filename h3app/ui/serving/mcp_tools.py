"""Tools for agents over MCP (``python app.py --mcp``: Gradio's MCP server, ``launch(mcp_server=True)``).

Four named endpoints, registered only when the MCP server is on, each a plain function whose name is the tool's
name and whose docstring is its description (Gradio reads ``Parameters:``/``Returns:``):
``search_h3_adapters``, ``inspect_adapter``, ``generate_video`` and ``check_alpha_equivalence``. They take the
adapter as ``source`` (+ ``weight_name``, ``revision``), as the command line does, and hold no session: each call
carries everything it needs, and each answers JSON text (Gradio hands an agent ``str()`` of a JSON output, which is
Python's spelling, not JSON; in hosted mode the text is redacted as the guard redacts JSON outputs). They run the
same code as the app's API endpoints (``api.py``) and the Hub panel (``hub/events.py``), so the same guards apply: ``endpoint_guard`` bounds inputs and redacts hosted answers, GPU
tools pass the GPU admission (``hosting.gpu_gate.admitted``), cheap ones queue under their own concurrency ids
and count against the visitor's bound (``hosting/join_bound.py``). Gradio lists every public endpoint as a tool, so the
app's six API endpoints appear beside these four.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import gradio as gr

from ...adapters.catalog import passed
from ...adapters.source.search import DEFAULT_LIMIT, DEFAULT_SORT, MAX_LIMIT
from ...hosting.gpu_gate import admitted, gpu_events
from ...rules.check_pair import DEFAULT_A, DEFAULT_B
from ...rules.choices import T2VA
from ...rules.frames import RELEASED
from ..hub.events import HubEvents
from .api import ApiEvents
from .endpoint_guard import Redactor

if TYPE_CHECKING:
    from ...backend.service import Backend

TOOL_NAMES = ("search_h3_adapters", "inspect_adapter", "generate_video", "check_alpha_equivalence")


class McpTools:
    """The tool functions (see the module docstring); ``api``: the app's API events, ``hub``: the Hub panel's."""

    def __init__(self, api: ApiEvents, hub: HubEvents) -> None:
        self.api = api
        self.hub = hub
        self.redactor = Redactor(hub.backend) if hub.backend.hosted else None

    def _text(self, answer: dict[str, Any]) -> str:
        """``answer`` as JSON text (redacted when hosted)."""
        return json.dumps(self.redactor.value(answer) if self.redactor is not None else answer, default=str)

    def search_h3_adapters(self, query: str, sort: str, limit: float, token: str) -> str:
        """Search the Hugging Face Hub for LoRA adapters of MiniMax-H3 (repos tagged
        base_model:adapter:MiniMaxAI/MiniMax-H3); nothing is downloaded.

        Parameters:
            query: text the repo id must contain (empty: every H3 adapter)
            sort: downloads, likes or updated (largest or latest first)
            limit: at most this many repos, 1 to MAX_LIMIT
            token: a Hugging Face token for private or gated repos (empty: none)
        Returns:
            JSON text: {results: [{repo_id, downloads, likes, updated, gated, files: [{name, size}], known: {file: preset},
            recommended: file or null}]}, as `python -m h3app search --json`
        """
        return self._text({"results": self.hub.search(query, sort or DEFAULT_SORT, token, limit=int(limit))})

    def inspect_adapter(self, source: str, weight_name: str, revision: str, token: str) -> str:
        """Check an adapter before downloading it: read its header only (HTTP range reads for a Hub file) and say
        whether it loads on this model, its format, rank, alpha and where the alpha comes from, and how many of
        the model's layers it targets.

        Parameters:
            source: a Hub repo id (owner/name), an HF URL, or a local path (hosted: the demo adapters)
            weight_name: the .safetensors file in the repo or folder (empty when there is only one)
            revision: branch, tag or commit (empty: main)
            token: a Hugging Face token for private or gated repos (empty: none)
        Returns:
            JSON text: the `python -m h3app inspect --json` object (with training: trainer, epoch, steps, trigger_words;
            not_applied: the keys a run leaves out and why; recipe: declared steps/shifts/sigmas), plus weight_files
            [{name, size}] and check {ok, line}
        """
        info = self.api.inspect(source, weight_name, revision, token)
        return self._text({**info, "check": passed(info).to_json()})

    def generate_video(self, prompt: str, source: str, weight_name: str, revision: str, alpha: str, scale: float,
                       seed: float, steps: float, duration: float, height: float, width: float, token: str,
                       request: gr.Request | None = None, progress: gr.Progress = gr.Progress()) -> tuple[Any, str]:
        """Generate one video with stereo audio from a text prompt, with one LoRA adapter applied (or none).

        Parameters:
            prompt: what the video shows and sounds like
            source: the adapter: a Hub repo id, an HF URL or a local path (empty: no adapter)
            weight_name: the adapter's .safetensors file (empty when there is only one)
            revision: the adapter's branch, tag or commit (empty: main)
            alpha: the adapter's alpha, a number, or auto (the file's own alpha chain)
            scale: the strength multiplier (1.0 = as trained)
            seed: the random seed (same seed and settings: the same output, bit for bit)
            steps: sigma points including the terminal one (N steps run N-1 transformer evaluations)
            duration: seconds, DURATION_RANGE
            height: pixels (0: the model's default canvas)
            width: pixels (0: the model's default canvas)
            token: a Hugging Face token for private or gated repos (empty: none)
        Returns:
            the mp4, and JSON text: the `python -m h3app generate --json` object with the run's full settings
        """
        video, answer = self.api.generate(
            session=None, prompt=prompt, seed=seed, steps=steps, duration=duration, height=height, width=width,
            shift=0, audio_shift=0, workflow=T2VA, adapters_json=_adapters(source, weight_name, revision, alpha, scale),
            token=token, request=request, progress=progress)
        return video, self._text(answer)

    def check_alpha_equivalence(self, source: str, weight_name: str, revision: str, prompt: str, seed: float,
                                steps: float, duration: float, height: float, width: float, alpha_a: str,
                                scale_a: float, alpha_b: str, scale_b: float, token: str,
                                request: gr.Request | None = None, progress: gr.Progress = gr.Progress()) -> str:
        """Check that two alpha/scale settings of one adapter give the same output (alpha 8 at scale 1.0 and alpha
        128 at scale 0.0625 do): runs A, A's first step again (determinism control), B and the old alpha = rank
        fallback through the full pipeline, and says whether A and B are bit-identical.

        Parameters:
            source: the adapter: a Hub repo id, an HF URL or a local path
            weight_name: the adapter's .safetensors file (empty when there is only one)
            revision: the adapter's branch, tag or commit (empty: main)
            prompt: the request's prompt
            seed: the random seed
            steps: sigma points including the terminal one
            duration: seconds, DURATION_RANGE
            height: pixels (0: default)
            width: pixels (0: default)
            alpha_a: A's alpha (a number, or auto)
            scale_a: A's scale
            alpha_b: B's alpha (a number, or auto)
            scale_b: B's scale
            token: a Hugging Face token for private or gated repos (empty: none)
        Returns:
            JSON text: the `python -m h3app check --json` object: identical, control_identical, hashes, max |A-B|, scales
        """
        return self._text(self.api.check_equivalence(
            session=None, prompt=prompt, seed=seed, steps=steps, duration=duration, height=height, width=width,
            alpha_a=alpha_a, scale_a=scale_a, alpha_b=alpha_b, scale_b=scale_b,
            adapters_json=_adapters(source, weight_name, revision, "auto", 1.0),
            token=token, request=request, progress=progress))


def _adapters(source: str, weight_name: str, revision: str, alpha: str, scale: float) -> str:
    """One adapter as the API's ``adapters_json`` (``[]``: none)."""
    if not (source or "").strip():
        return "[]"
    return json.dumps([{"source": source.strip(), "weight_name": (weight_name or "").strip() or None,
                        "revision": (revision or "").strip() or None, "alpha": alpha or "auto", "scale": scale}])


for _tool in (McpTools.generate_video, McpTools.check_alpha_equivalence):
    _tool.__doc__ = (_tool.__doc__ or "").replace("DURATION_RANGE", RELEASED.describe())
McpTools.search_h3_adapters.__doc__ = (McpTools.search_h3_adapters.__doc__ or "").replace("MAX_LIMIT", str(MAX_LIMIT))


def build_mcp_tools(tools: McpTools, backend: Backend) -> None:
    """Hidden inputs and outputs for the four tools (inside the current Blocks context)."""
    defaults = backend.defaults  # the held model's request defaults, as the UI's controls and the API show them
    with gr.Column(visible=False):
        text = {name: gr.Textbox(value=value, label=label) for name, value, label in (
            ("query", "", "text the repo id must contain"), ("sort", DEFAULT_SORT, "downloads, likes or updated"),
            ("source", "", "adapter source: Hub repo id, HF URL or local path"),
            ("weight_name", "", "weight file name (empty: the only one)"),
            ("revision", "", "branch, tag or commit (empty: main)"), ("token", "", "Hugging Face token (empty: none)"),
            ("alpha", "auto", "alpha: a number, or auto"), ("prompt", defaults.prompt, "prompt"),
            ("alpha_a", f"{DEFAULT_A.alpha:g}", "A: alpha"), ("alpha_b", f"{DEFAULT_B.alpha:g}", "B: alpha"))}
        number = {name: gr.Number(value=value, label=label, precision=precision) for name, value, label, precision in (
            ("limit", DEFAULT_LIMIT, f"results, 1 to {MAX_LIMIT}", 0), ("scale", 1.0, "scale (strength)", None),
            ("seed", defaults.seed, "seed", 0), ("steps", defaults.steps, "steps (N steps run N-1 evaluations)", 0),
            ("duration", defaults.duration, "duration in seconds", None),
            ("height", 0, "height in pixels (0: default)", 0), ("width", 0, "width in pixels (0: default)", 0),
            ("scale_a", DEFAULT_A.strength, "A: scale", None), ("scale_b", DEFAULT_B.strength, "B: scale", None))}
        result = {name: gr.Textbox(label=f"{name}: JSON text") for name in TOOL_NAMES}
        video = gr.Video(label="mp4 with stereo audio")
        buttons = {name: gr.Button(name) for name in TOOL_NAMES}
    cheap = 4  # the concurrency limit of the cheap tools (search, inspect)
    gpu = gpu_events(backend)
    request_inputs = [number["seed"], number["steps"], number["duration"], number["height"], number["width"]]
    buttons["search_h3_adapters"].click(
        tools.search_h3_adapters, [text["query"], text["sort"], number["limit"], text["token"]],
        [result["search_h3_adapters"]], api_name="search_h3_adapters", concurrency_id="hub",
        concurrency_limit=cheap)
    buttons["inspect_adapter"].click(
        tools.inspect_adapter, [text["source"], text["weight_name"], text["revision"], text["token"]],
        [result["inspect_adapter"]], api_name="inspect_adapter", concurrency_id="inspect",
        concurrency_limit=cheap)
    buttons["generate_video"].click(
        admitted(tools.generate_video, backend), [text["prompt"], text["source"], text["weight_name"],
                                                  text["revision"], text["alpha"], number["scale"], *request_inputs,
                                                  text["token"]],
        [video, result["generate_video"]], api_name="generate_video", **gpu)
    buttons["check_alpha_equivalence"].click(
        admitted(tools.check_alpha_equivalence, backend),
        [text["source"], text["weight_name"], text["revision"], text["prompt"], *request_inputs, text["alpha_a"],
         number["scale_a"], text["alpha_b"], number["scale_b"], text["token"]],
        [result["check_alpha_equivalence"]], api_name="check_alpha_equivalence", **gpu)


__all__ = ["TOOL_NAMES", "McpTools", "build_mcp_tools"]
