""""Copy as CLI": a run's settings JSON → the h3app command, the sglang command (with notes where sglang would not
give the same result) and a diffusers snippet. Pure text; nothing here touches a model.

The settings JSON is the one the backend embeds in every mp4: ``{"model", "request": GenerationRequest fields,
"adapters": [provenance: source, weight_name, revision, commit, sha256, rank, alpha (explicit or None),
resolved_alpha, alpha_source, strength, mode …]}``.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..rules.frames import RELEASED
from ..rules.scale import effective_scale

REAL_MODEL = "MiniMaxAI/MiniMax-H3"
TINY = "tiny"


def _q(value: Any) -> str:
    return shlex.quote(str(value))


def _num(value: float) -> str:
    return f"{float(value):g}" if float(value) == float(f"{float(value):g}") else repr(float(value))


def _pinned_revision(adapter: Mapping[str, Any]) -> str | None:
    """The commit the bytes came from when known (exact reproduction), else the revision asked for."""
    return adapter.get("commit") or adapter.get("revision")


def h3app_command(settings: Mapping[str, Any], out: str = "out.mp4") -> str:
    """``python -m h3app generate …`` reproducing ``settings`` (revision pinned to the commit when known)."""
    request = settings.get("request", {})
    parts = ["python -m h3app generate", f"--model {_q(settings.get('model', TINY))}",
             f"--workflow {_q(request.get('workflow', 't2va'))}", f"--prompt {_q(request.get('prompt', ''))}",
             f"--seed {int(request.get('seed', 0))}", f"--steps {int(request.get('steps', 5))}",
             f"--duration {_num(request.get('duration', 5.0))}"]
    if request.get("height") is not None:
        parts.append(f"--height {int(request['height'])} --width {int(request['width'])}")
    for key, flag in (("shift", "--shift"), ("audio_shift", "--audio-shift")):
        if request.get(key) is not None:
            parts.append(f"{flag} {_num(request[key])}")
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
            parts.append(f"--adapter {_q(adapter['source'])}")
            if adapter.get("weight_name"):
                parts.append(f"--weight-name {_q(adapter['weight_name'])}")
            if _pinned_revision(adapter):
                parts.append(f"--revision {_q(_pinned_revision(adapter))}")
            if alpha is not None:
                parts.append(f"--alpha {_num(alpha)}")
            parts.append(f"--scale {_num(adapter.get('strength', 1.0))}")
        else:
            spec = [str(adapter["source"])]
            if adapter.get("weight_name"):
                spec.append(f"weight={adapter['weight_name']}")
            if _pinned_revision(adapter):
                spec.append(f"rev={_pinned_revision(adapter)}")
            spec.append(f"alpha={'auto' if alpha is None else _num(alpha)}")
            spec.append(f"scale={_num(adapter.get('strength', 1.0))}")
            parts.append(f"--adapter-spec {_q(','.join(spec))}")
    if adapters and adapters[0].get("mode", "unmerged") != "unmerged":
        parts.append(f"--mode {_q(adapters[0]['mode'])}")
    parts.append(f"--out {_q(out)} --json")
    return " \\\n  ".join(parts)


@dataclass(frozen=True)
class SglangCommand:
    """The command and the notes on where sglang's result would differ from h3app's (empty: it would match)."""

    command: str
    notes: tuple[str, ...]


def _integral(value: float) -> bool:
    return math.isfinite(value) and float(value).is_integer()


def sglang_command(settings: Mapping[str, Any], infos: Sequence[Mapping[str, Any] | None] = ()) -> SglangCommand:
    """``sglang generate … --lora-path/--lora-weight-name/--lora-alpha/--lora-scale`` for the first adapter.

    ``infos`` are the adapters' ``AdapterInfo.to_json()`` when known (per-module alphas and their sources). sglang
    resolves alpha per module as: a ``.alpha`` tensor (``int()``-truncated) > ``--lora-alpha`` (an integer) >
    ``adapter_config.json`` / header metadata > rank (docs/architecture.md, decision 11).
    """
    request = settings.get("request", {})
    model = settings.get("model", TINY)
    notes: list[str] = []
    if model == TINY:
        notes.append("sglang serves the real weights: the command names MiniMaxAI/MiniMax-H3 instead of h3app's "
                     "tiny checkpoint, so only the adapter flags carry over.")
        model = REAL_MODEL
    parts = ["sglang generate", f"--model-path {_q(model)}", f"--prompt {_q(request.get('prompt', ''))}",
             f"--seed {int(request.get('seed', 0))}",
             f"--num-inference-steps {int(request.get('steps', 5))}"]
    adapters = list(settings.get("adapters") or ())
    if adapters:
        adapter = adapters[0]
        info = infos[0] if infos else None
        parts.append(f"--lora-path {_q(adapter['source'])}")
        if adapter.get("weight_name"):
            parts.append(f"--lora-weight-name {_q(adapter['weight_name'])}")
        alpha_flag, scale, alpha_notes = _sglang_alpha(adapter, info)
        notes.extend(alpha_notes)
        if alpha_flag is not None:
            parts.append(f"--lora-alpha {alpha_flag}")
        parts.append(f"--lora-scale {_num(scale)}")
        if _pinned_revision(adapter):
            notes.append(f"sglang has no revision flag: download revision {_pinned_revision(adapter)} and give "
                         f"--lora-path the local folder to pin the exact file.")
    if len(adapters) > 1:
        notes.append("sglang's command line takes one startup adapter: add the second with POST /v1/set_lora "
                     "(lists of lora_nickname, lora_path, strength, lora_alpha).")
    return SglangCommand(" \\\n  ".join(parts), tuple(notes))


def _sglang_alpha(adapter: Mapping[str, Any], info: Mapping[str, Any] | None
                  ) -> tuple[int | None, float, list[str]]:
    """(``--lora-alpha`` value or None, ``--lora-scale``, notes)."""
    notes: list[str] = []
    strength = float(adapter.get("strength", 1.0))
    explicit = adapter.get("alpha")
    sources = dict((info or {}).get("alpha_sources") or {})
    alphas = dict((info or {}).get("alphas") or {})
    ranks = set(((info or {}).get("ranks") or {}).values()) or ({adapter["rank"]} if adapter.get("rank") else set())
    tensor_alphas = sorted({float(alphas[t]) for t, s in sources.items() if s == "module_tensor" and t in alphas})
    if not sources and adapter.get("alpha_source") == "module_tensor" and adapter.get("stored_alpha") is not None:
        tensor_alphas = [float(adapter["stored_alpha"])]
    if tensor_alphas:
        fractional = [a for a in tensor_alphas if not _integral(a)]
        if fractional:
            truncated = ", ".join(str(int(a)) for a in fractional)
            ratios = "/".join(f"{int(a) / a:.2g}" for a in fractional)
            notes.append(f"the file's per-module .alpha tensors ({', '.join(f'{a:g}' for a in fractional)}) are "
                         f"int()-truncated by sglang (→ {truncated}): its LoRA would be {ratios}× as strong as "
                         f"here.")
        if explicit is not None and any(float(explicit) != a for a in tensor_alphas):
            notes.append(f"this file has per-module .alpha tensors: sglang applies them and ignores --lora-alpha, so "
                         f"your alpha {float(explicit):g} would have no effect there (it runs at alpha "
                         f"{', '.join(f'{a:g}' for a in tensor_alphas)}).")
        return None, strength, notes
    alpha = float(explicit) if explicit is not None else adapter.get("resolved_alpha")
    if alpha is None:
        # mixed per-module alphas from a config or metadata: sglang reads the same sources itself
        return None, strength, notes
    alpha = float(alpha)
    if _integral(alpha) and alpha > 0:
        return int(alpha), strength, notes
    if len(ranks) == 1:
        rank = next(iter(ranks))
        notes.append(f"sglang's --lora-alpha is an integer (int() would truncate {alpha:g} to {int(alpha)}); the "
                     f"command uses the equivalent alpha {rank} × scale "
                     f"{effective_scale(alpha, strength, rank):.6g} instead — "
                     f"same product, though not bit-identical to h3app's float64 scale.")
        return int(rank), effective_scale(alpha, strength, rank), notes
    notes.append(f"sglang's --lora-alpha is an integer: alpha {alpha:g} would become {int(alpha)} "
                 f"({int(alpha) / alpha:.2g}× as strong), and mixed ranks leave no exact integer equivalent.")
    return int(alpha), strength, notes


def diffusers_snippet(settings: Mapping[str, Any]) -> str:
    """Python that reproduces the adapter part in diffusers: export with alpha × scale baked in, then load it."""
    request = settings.get("request", {})
    model = settings.get("model", TINY)
    model_path = "assets/tiny-h3" if model == TINY else model
    adapters = list(settings.get("adapters") or ())
    lines = ["# 1) Bake h3app's alpha × scale into a clean diffusers/PEFT adapter (exact ΔW; see docs/adapters.md):"]
    for index, adapter in enumerate(adapters):
        flags = [f"--adapter {_q(adapter['source'])}"]
        if adapter.get("weight_name"):
            flags.append(f"--weight-name {_q(adapter['weight_name'])}")
        if _pinned_revision(adapter):
            flags.append(f"--revision {_q(_pinned_revision(adapter))}")
        if adapter.get("alpha") is not None:
            flags.append(f"--alpha {_num(adapter['alpha'])}")
        flags.append(f"--scale {_num(adapter.get('strength', 1.0))}")
        lines.append(f"#    python -m h3app export {' '.join(flags)} --out lora_{index + 1}")
    lines += [
        "import torch",
        "from diffusers import ModularPipeline",
        "",
        f"pipe = ModularPipeline.from_pretrained({model_path!r}, workflow={request.get('workflow', 't2va')!r})",
        "pipe.load_components(dtype=torch.bfloat16)",
        'pipe.to("cuda")',
    ]
    names = []
    for index, _ in enumerate(adapters):
        names.append(f"lora_{index + 1}")
        lines.append(f'pipe.load_lora_weights("lora_{index + 1}", weight_name="adapter_model.safetensors", '
                     f'adapter_name="lora_{index + 1}")')
    if names:
        lines.append(f"pipe.set_adapters({names!r}, adapter_weights={[1.0] * len(names)!r})  "
                     "# strength is baked into the exported alpha")
    for key, component in (("shift", "scheduler"), ("audio_shift", "audio_scheduler")):
        if request.get(key) is not None:
            lines.append(f"pipe.{component}.set_shift({float(request[key])!r})")
    call = [f"prompt={request.get('prompt', '')!r}", f"num_inference_steps={int(request.get('steps', 5))}",
            f"num_frames={RELEASED.requested_frames(float(request.get('duration', 5.0)))}",
            f"generator=torch.Generator('cpu').manual_seed({int(request.get('seed', 0))})", "output_type='np'"]
    if request.get("height") is not None:
        call.insert(2, f"height={int(request['height'])}, width={int(request['width'])}")
    lines.append("state = pipe(" + ", ".join(call) + ")")
    lines.append('video, audio = state.get("videos")[0], state.get("audio")[0]  # [F, H, W, 3] in [0, 1]; [2, S]')
    return "\n".join(lines)
