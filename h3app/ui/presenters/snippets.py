""""Copy as CLI": a run's settings JSON → the h3app command, the sglang command (with notes where sglang would not
give the same result) and a diffusers snippet. Pure text; nothing here touches a model.

The settings JSON is the one the backend embeds in every mp4: ``{"model", "request": GenerationRequest fields,
"adapters": [provenance: source, weight_name, revision, commit, sha256, rank, alpha (explicit or None),
resolved_alpha, alpha_source, strength, mode …]}``.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...adapters.known import TINY_DEMO_DIR
from ...adapters.resolved import resolve_adapter
from ...adapters.sglang import SglangFlags, advanced_strength_notes, solve_flags
from ...adapters.source.names import is_url
from ...adapters.source.refs import parse_hf_url
from ...adapters.summary import applied_lines
from ...errors import H3AppError
from ...rules.alpha_source import AlphaSource
from ...rules.choices import MAIN_PARTITION, NO_CACHE, REAL_REPO_ID, T2VA, UNMERGED, workflow_partition
from ...rules.frames import RELEASED
from ...rules.request_defaults import defaults_for
from ...rules.steps import evaluations
from ...settings import ALIASES, KNOBS, recorded, spelled

REAL_MODEL = REAL_REPO_ID


def _request(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings' request, with its model's defaults (``rules.request_defaults``) where a field is missing."""
    defaults = defaults_for(settings.get("model", TINY))
    return {"seed": defaults.seed, "steps": defaults.steps, "duration": defaults.duration,
            **settings.get("request", {})}
TINY = "tiny"


def _q(value: Any) -> str:
    return shlex.quote(str(value))


def _num(value: float) -> str:
    return f"{float(value):g}" if float(value) == float(f"{float(value):g}") else repr(float(value))


def adapter_source(adapter: Mapping[str, Any]) -> str:
    """The adapter's source as the visitor's source box had it, so that a snippet runs as printed: a hosted
    server's settings name a local file by its name (``outputs.names_only``), and a demo adapter's name is its
    path under the app's folder again (``assets/adapters/…``, as the box showed it: ``shown_path``); an upload
    stays its file name (the visitor holds that file); a Hub source, a URL or a local path as given."""
    source = str(adapter["source"])
    named = Path(source)
    if adapter.get("local") and not named.is_absolute() and len(named.parts) == 1 and (TINY_DEMO_DIR / source).exists():
        return os.path.relpath(TINY_DEMO_DIR / source)
    return source


def model_device(model: str) -> tuple[str, str]:
    """``(device, torch dtype name)`` a diffusers snippet runs ``model`` on: the tiny checkpoint on the CPU in
    float32 (it is what this app runs there), the real weights on a CUDA GPU in bfloat16."""
    return ("cpu", "float32") if model == TINY else ("cuda", "bfloat16")


def _pinned_revision(adapter: Mapping[str, Any]) -> str | None:
    """The commit the bytes came from when known (exact reproduction), else the revision asked for."""
    return adapter.get("commit") or adapter.get("revision")


def run_frames(settings: Mapping[str, Any]) -> int:
    """The frames the run made: its result's count, else what its duration gives under the released frame rule
    (snapped up to 17n + 5: 124 for 5 s, not the 120 asked for)."""
    result = settings.get("result") or {}
    if result.get("frames"):
        return int(result["frames"])
    return RELEASED.frames(float(_request(settings)["duration"]))


def run_steps(settings: Mapping[str, Any]) -> int:
    """The steps the run used (presets already applied to its request)."""
    return int(_request(settings)["steps"])


def applied_comment(settings: Mapping[str, Any]) -> list[str]:
    """Comment lines heading every snippet: what the run made and applied, in the one summary's words."""
    steps = run_steps(settings)
    lines = [f"# this run: {run_frames(settings)} frames, {steps} steps ({evaluations(steps)} evaluations)"]
    lines += [f"# applied {line}" for line in applied_lines(settings.get("adapters") or ())]
    return lines


def h3app_command(settings: Mapping[str, Any], out: str = "out.mp4") -> str:
    """``python -m h3app generate …`` reproducing ``settings`` (revision pinned to the commit when known)."""
    request = _request(settings)
    parts = ["python -m h3app generate", f"--model {_q(settings.get('model', TINY))}",
             f"--workflow {_q(request.get('workflow', T2VA))}", f"--prompt {_q(request.get('prompt', ''))}",
             f"--seed {int(request['seed'])}", f"--steps {run_steps(settings)}",
             f"--duration {_num(request.get('duration', RELEASED.shortest_seconds))}"]
    if request.get("height") is not None:
        parts.append(f"--height {int(request['height'])} --width {int(request['width'])}")
    for key, flag in (("shift", "--shift"), ("audio_shift", "--audio-shift")):
        if request.get(key) is not None:
            parts.append(f"{flag} {_num(request[key])}")
    if request.get("cache", NO_CACHE) != NO_CACHE:
        parts.append(f"--cache {_q(request['cache'])}")
    if request.get("first_frame"):
        parts.append(f"--first-frame {_q(request['first_frame'])}")
    if request.get("last_frame"):
        parts.append(f"--last-frame {_q(request['last_frame'])}")
    for reference in request.get("references") or ():
        parts.append(f"--reference {_q(reference)}")
    adapters = list(settings.get("adapters") or ())
    for index, adapter in enumerate(adapters):
        alpha = adapter.get("alpha")
        if index == 0:
            parts.append(f"--adapter {_q(adapter_source(adapter))}")
            if adapter.get("weight_name"):
                parts.append(f"--weight-name {_q(adapter['weight_name'])}")
            if _pinned_revision(adapter):
                parts.append(f"--revision {_q(_pinned_revision(adapter))}")
            if alpha is not None:
                parts.append(f"--alpha {_num(alpha)}")
            parts.append(f"--scale {_num(adapter.get('strength', 1.0))}")
            parts += [f"{flag} {_q(value)}" for flag, _, value in _advanced(adapter)]
        else:
            spec = [adapter_source(adapter)]
            if adapter.get("weight_name"):
                spec.append(f"weight={adapter['weight_name']}")
            if _pinned_revision(adapter):
                spec.append(f"rev={_pinned_revision(adapter)}")
            spec.append(f"alpha={'auto' if alpha is None else _num(alpha)}")
            spec.append(f"scale={_num(adapter.get('strength', 1.0))}")
            spec += [f"{key}={value}" for _, key, value in _advanced(adapter)]
            parts.append(f"--adapter-spec {_q(','.join(spec))}")
    if adapters and adapters[0].get("mode", UNMERGED) != UNMERGED:
        parts.append(f"--lora-mode {_q(adapters[0]['mode'])}")
    parts.append(f"--out {_q(out)} --json")
    return "\n".join(applied_comment(settings)) + "\n" + " \\\n  ".join(parts)


BAKED = frozenset(k.name for k in KNOBS if k.bakes)  # what ``export`` writes into a LoRA file


def _advanced(adapter: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(flag, spec key, value)`` of each advanced strength the run set (a factor other than 1, a schedule, block
    ranges; ``settings.KNOBS``); nothing for a run that set none."""
    return [(knob.flag, knob.key, spelled(value)) for knob, value in recorded(adapter).items() if knob.is_set(value)]


@dataclass(frozen=True)
class SglangCommand:
    """The command and the notes on where sglang's result would differ from h3app's (empty: it would match)."""

    command: str
    notes: tuple[str, ...]


def sglang_command(settings: Mapping[str, Any], infos: Sequence[Mapping[str, Any] | None] = ()) -> SglangCommand:
    """``sglang generate … --lora-path/--lora-weight-name/--lora-alpha/--lora-scale`` for the first adapter, with
    the flags under which sglang's alpha rules (``adapters/sglang.py``) give every module h3app's effective scale;
    where no flags can, the command is one comment line saying why.

    ``infos`` are the adapters' ``AdapterInfo.to_json()`` (per-module alphas, ranks and ``sglang`` facts).
    """
    request = _request(settings)
    model = settings.get("model", TINY)
    notes: list[str] = []
    if model == TINY:
        notes.append("sglang serves the real weights: the command names MiniMaxAI/MiniMax-H3 instead of h3app's "
                     "tiny checkpoint, so only the adapter flags carry over.")
        model = REAL_MODEL
    parts = ["sglang generate", f"--model-path {_q(model)}", f"--prompt {_q(request.get('prompt', ''))}",
             f"--seed {int(request['seed'])}", f"--num-inference-steps {run_steps(settings)}",
             f"--num-frames {run_frames(settings)}"]
    if request.get("height") is not None and request.get("width") is not None:
        parts.append(f"--height {int(request['height'])} --width {int(request['width'])}")
    adapters = list(settings.get("adapters") or ())
    if adapters:
        adapter = adapters[0]
        flags = _sglang_flags(adapter, infos[0] if infos else None)
        if flags.reason is not None:
            return SglangCommand(f"# {flags.reason}", (flags.reason,))
        parts.append(f"--lora-path {_q(_sglang_path(adapter_source(adapter)))}")
        if adapter.get("weight_name"):
            parts.append(f"--lora-weight-name {_q(adapter['weight_name'])}")
        if flags.alpha is not None:
            parts.append(f"--lora-alpha {flags.alpha}")
        scale = flags.scale if flags.scale is not None else 1.0  # None only with a reason, answered above
        parts.append(f"--lora-scale {_num(scale)}")
        if not flags.exact:
            notes.append(f"sglang's --lora-alpha is an integer: the command gives alpha {flags.alpha} × scale "
                         f"{_num(scale)}, the same product as h3app's alpha × scale, though not bit-identical "
                         "to h3app's float64 scale.")
        if _pinned_revision(adapter):
            notes.append(f"sglang has no revision flag: download revision {_pinned_revision(adapter)} and give "
                         f"--lora-path the local folder to pin the exact file.")
    if len(adapters) > 1:
        notes.append("sglang's command line takes one startup adapter: add the second with POST /v1/set_lora "
                     "(lists of lora_nickname, lora_path, strength, lora_alpha).")
    for adapter in adapters:  # what sglang has no flag for
        notes += advanced_strength_notes(adapter, "sglang")
    return SglangCommand("\n".join(applied_comment(settings)) + "\n" + " \\\n  ".join(parts), tuple(notes))


def _sglang_path(source: str) -> str:
    """``--lora-path``: a Hub URL as its repo id (the weight name, a path in the repo, names the file: sglang reads
    a folder URL's weight name relative to that folder), anything else as given."""
    if is_url(str(source)):
        try:
            return parse_hf_url(str(source), None, None).repo_id or str(source)
        except H3AppError:
            return str(source)
    return str(source)


def _sglang_flags(adapter: Mapping[str, Any], info: Mapping[str, Any] | None) -> SglangFlags:
    """The flags for one adapter: h3app's effective scale per module (the run's alpha, strength and group
    strengths through the one scale formula) against what sglang's rules make of the same file."""
    strength = float(adapter.get("strength", 1.0))
    info = info or {}
    facts = dict(info.get("sglang") or {})
    ranks = dict(info.get("ranks") or {})
    if not facts.get("modules") or not ranks:  # no inspection at hand: the run's one rank and alpha
        rank = adapter.get("rank")
        if not rank:
            return SglangFlags(None, None, reason="No sglang command can be checked for this run: its adapter's "
                                                  "ranks are not recorded; inspect the adapter first.")
        stored = adapter.get("stored_alpha") if adapter.get("alpha_source") == AlphaSource.MODULE_TENSOR else None
        facts = {"modules": {"*": {"rank": rank, "tensor_alpha": stored, "pattern_alpha": None, "qkv_group": None}}}
        resolved = adapter.get("resolved_alpha")
        info = {"ranks": {"*": rank}, "alphas": {"*": resolved} if isinstance(resolved, (int, float)) else {},
                "use_rslora": info.get("use_rslora")}
    groups = adapter.get("group_strengths") if "*" not in info["ranks"] else None
    scales = resolve_adapter(info, adapter.get("alpha"), strength, groups).scales
    return solve_flags(facts, scales, strength)


def _export_lines(adapters: list[Mapping[str, Any]], partition: str) -> list[str]:
    """The ``export`` command, commented: adapter 1 by flags, every further adapter in use as an ``--adapter-spec``
    of the same stack (one file whose run at strength 1 is theirs: ``adapters/stack.py``); what a LoRA file cannot
    hold (a schedule, per-modality factors) is left out with a note per adapter."""
    lines: list[str] = []
    flags: list[str] = []
    for index, adapter in enumerate(adapters):
        baked = [(flag, key, value) for flag, key, value in _advanced(adapter) if ALIASES[key] in BAKED]
        unbaked = {k: v for k, v in adapter.items() if ALIASES.get(k) not in BAKED}  # what a file cannot hold
        lines += [f"# NOTE: {note}" for note in advanced_strength_notes(unbaked, "diffusers")]
        if index:
            spec = [adapter_source(adapter)]
            spec += [f"weight={adapter['weight_name']}"] if adapter.get("weight_name") else []
            spec += [f"rev={_pinned_revision(adapter)}"] if _pinned_revision(adapter) else []
            spec += [f"alpha={_num(adapter['alpha'])}"] if adapter.get("alpha") is not None else []
            spec += [f"scale={_num(adapter.get('strength', 1.0))}"]
            spec += [f"{key}={value}" for _, key, value in baked]
            flags.append(f"--adapter-spec {_q(','.join(spec))}")
            continue
        flags.append(f"--adapter {_q(adapter_source(adapter))}")
        if adapter.get("weight_name"):
            flags.append(f"--weight-name {_q(adapter['weight_name'])}")
        if _pinned_revision(adapter):
            flags.append(f"--revision {_q(_pinned_revision(adapter))}")
        if adapter.get("alpha") is not None:
            flags.append(f"--alpha {_num(adapter['alpha'])}")
        flags.append(f"--scale {_num(adapter.get('strength', 1.0))}")
        flags += [f"{flag} {_q(value)}" for flag, _, value in baked]  # baked into the exported alphas
    if adapters and partition != MAIN_PARTITION:  # the exported keys name it, so diffusers loads them into it
        flags.append(f"--partition {partition}")
    if adapters:
        lines.append(f"#    python -m h3app export {' '.join(flags)} --out lora_1")
    return lines


def diffusers_snippet(settings: Mapping[str, Any]) -> str:
    """Python that reproduces the adapter part in diffusers: export with alpha × scale baked in, then load it."""
    request = _request(settings)
    model = settings.get("model", TINY)
    model_path = "assets/tiny-h3" if model == TINY else model
    device, dtype = model_device(str(model))
    adapters = list(settings.get("adapters") or ())
    lines = [*applied_comment(settings),
             "# 1) Bake h3app's alpha × scale into a clean diffusers/PEFT adapter (exact ΔW; see docs/adapters.md):"]
    partition = workflow_partition(request.get("workflow", T2VA))
    lines += _export_lines(adapters, partition)
    lines += [
        "import torch",
        "from diffusers import ModularPipeline",
        "",
        f"pipe = ModularPipeline.from_pretrained({model_path!r}, workflow={request.get('workflow', T2VA)!r})",
        f"pipe.load_components(dtype=torch.{dtype})",
        f"pipe.to({device!r})",
    ]
    if adapters:  # one file: the adapters in use as one stack (export --adapter-spec), strength baked in
        lines.append('pipe.load_lora_weights("lora_1", weight_name="adapter_model.safetensors", adapter_name="lora_1")')
        lines.append("pipe.set_adapters(['lora_1'], adapter_weights=[1.0])  # strength is baked into the exported "
                     "alpha")
    for key, component in (("shift", "scheduler"), ("audio_shift", "audio_scheduler")):
        if request.get(key) is not None:
            lines.append(f"pipe.{component}.set_shift({float(request[key])!r})")
    call = [f"prompt={request.get('prompt', '')!r}", f"num_inference_steps={run_steps(settings)}",
            f"num_frames={run_frames(settings)}",
            f"generator=torch.Generator('cpu').manual_seed({int(request['seed'])})", "output_type='np'"]
    if request.get("height") is not None:
        call.insert(2, f"height={int(request['height'])}, width={int(request['width'])}")
    lines.append("state = pipe(" + ", ".join(call) + ")")
    lines.append('video, audio = state.get("videos")[0], state.get("audio")[0]  # [F, H, W, 3] in [0, 1]; [2, S]')
    return "\n".join(lines)
