"""How an adapter file was trained, from its safetensors header metadata alone (no tensor is read).

:func:`read_training` turns the header's ``__metadata__`` (a string → string map) into a :class:`TrainingInfo`: the
trainer, epoch, steps, base model, network dim/alpha, output name and the trigger words, each with the metadata key
it comes from. ``inspect`` (CLI text and ``--json``'s ``training``), the page's adapter card and the MCP inspect tool
show it; :meth:`TrainingInfo.order` sorts a trainer's checkpoints of one run (``…-000004.safetensors``) by progress.

Where each fact comes from (docs/adapters.md, "Training metadata"):

- **trainer**: ai-toolkit's ``software`` JSON (``{"name": "ai-toolkit", …}``); SimpleTuner's ``lycoris_config`` (its
  LyCORIS saves) or a ``software``/``modelspec.implementation`` that names it; musubi-tuner's H3 keys
  ``ss_minimax_h3_*`` or its ``networks.lora_*`` network modules; LyCORIS' ``lycoris.*`` network module; any other
  ``ss_*`` key: kohya sd-scripts.
- **epoch / steps**: ``ss_epoch`` / ``ss_steps`` (kohya, musubi); ai-toolkit's ``training_info`` JSON (``step``,
  ``epoch``).
- **base model**: ``ss_base_model_version``, ``modelspec.architecture``, ``ss_sd_model_name``, an ai-toolkit
  ``config``'s ``name_or_path``, the first present.
- **network dim / alpha**: ``ss_network_dim`` / ``ss_network_alpha``: shown, **never applied** (the alpha chain,
  docs/architecture.md decision 5, reads per-module tensors first; a global CLI value may disagree with them).
- **trigger words**: ``modelspec.trigger_phrase``; ai-toolkit's ``trigger_word`` (in a ``config`` JSON entry, or
  the single tag its ``ss_tag_frequency`` records); kohya's ``ss_tag_frequency`` (``{dataset: {tag: count}}``,
  summed over datasets): the tags that occur most often (a trigger word is in every caption), at most
  ``MAX_TRIGGERS``; with no tags, the instance prompt of kohya's ``<repeats>_<prompt>`` dataset folders
  (``ss_dataset_dirs``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

KOHYA = "kohya sd-scripts"
MUSUBI = "musubi-tuner"
AI_TOOLKIT = "ai-toolkit"
SIMPLETUNER = "SimpleTuner"
LYCORIS = "LyCORIS"

MAX_TRIGGERS = 3  # trigger words taken from tag counts (the tags tied for the top count)
MAX_TAGS = 10  # the most frequent tags shown
MUSUBI_H3_PREFIX = "ss_minimax_h3_"  # musubi-tuner's MiniMax-H3 training keys
_BASE_MODEL_KEYS = ("ss_base_model_version", "modelspec.architecture", "ss_sd_model_name")
_MUSUBI_MODULES = ("networks.lora_",)
_FOLDER = re.compile(r"^\d+_(.+)$")  # kohya's ``<repeats>_<instance prompt>`` dataset folder  # musubi's per-architecture network modules (networks.lora_wan, …)


@dataclass(frozen=True)
class TrainingInfo:
    """What the metadata says about training. ``sources`` maps each field set to the metadata key it came from;
    ``tags`` are the most frequent caption tags as ``(tag, count)``; ``trainer_settings`` the trainer's own
    model-specific keys (musubi's ``ss_minimax_h3_*``), as written."""

    trainer: str | None = None
    epoch: int | None = None
    steps: int | None = None
    base_model: str | None = None
    network_dim: float | None = None
    network_alpha: float | None = None
    network_module: str | None = None
    output_name: str | None = None
    trigger_words: tuple[str, ...] = ()
    tags: tuple[tuple[str, int], ...] = ()
    trainer_settings: Mapping[str, str] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(v not in (None, [], {}) for k, v in self.to_json().items() if k not in ("sources", "order"))

    @property
    def trigger(self) -> str | None:
        """The first trigger word (what the page's "Add trigger word" puts into the prompt), or None."""
        return self.trigger_words[0] if self.trigger_words else None

    @property
    def order(self) -> tuple[int, int]:
        """Sort key of one run's checkpoints: ``(steps, epoch)``, -1 where unknown (unknown first)."""
        return (-1 if self.steps is None else self.steps, -1 if self.epoch is None else self.epoch)

    def to_json(self) -> dict[str, Any]:
        return {"trainer": self.trainer, "epoch": self.epoch, "steps": self.steps, "base_model": self.base_model,
                "network_dim": self.network_dim, "network_alpha": self.network_alpha,
                "network_module": self.network_module, "output_name": self.output_name,
                "trigger_words": list(self.trigger_words), "tags": [[t, n] for t, n in self.tags],
                "trainer_settings": dict(self.trainer_settings), "sources": dict(self.sources),
                "order": list(self.order)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> TrainingInfo:
        """From :meth:`to_json` (None or ``{}``: nothing known)."""
        data = data or {}
        return cls(trainer=data.get("trainer"), epoch=data.get("epoch"), steps=data.get("steps"),
                   base_model=data.get("base_model"), network_dim=data.get("network_dim"),
                   network_alpha=data.get("network_alpha"), network_module=data.get("network_module"),
                   output_name=data.get("output_name"), trigger_words=tuple(data.get("trigger_words") or ()),
                   tags=tuple((str(t), int(n)) for t, n in data.get("tags") or ()),
                   trainer_settings=dict(data.get("trainer_settings") or {}), sources=dict(data.get("sources") or {}))

    def facts(self) -> list[str]:
        """The facts in words, one per item: ``trained with musubi-tuner``, ``epoch 4``, ``1,200 steps``, …"""
        words = [f"trained with {self.trainer}" if self.trainer else "",
                 f"epoch {self.epoch}" if self.epoch is not None else "",
                 f"{self.steps:,} steps" if self.steps is not None else "",
                 f"base {self.base_model}" if self.base_model else "",
                 _network_words(self.network_dim, self.network_alpha),
                 f"output {self.output_name}" if self.output_name else ""]
        return [w for w in words if w]


def read_training(metadata: Mapping[str, str]) -> TrainingInfo:
    """The :class:`TrainingInfo` of a header's metadata (anything malformed is left out, never raised)."""
    sources: dict[str, str] = {}
    config = _json(metadata.get("config"))
    info = _json(metadata.get("training_info"))
    epoch = _first(sources, "epoch", (("ss_epoch", _int(metadata.get("ss_epoch"))),
                                      ("training_info.epoch", _int(_get(info, "epoch")))))
    steps = _first(sources, "steps", (("ss_steps", _int(metadata.get("ss_steps"))),
                                      ("training_info.step", _int(_get(info, "step")))))
    base = _first(sources, "base_model", [*((k, _text(metadata.get(k))) for k in _BASE_MODEL_KEYS),
                                          ("config.name_or_path", _text(_find(config, "name_or_path")))])
    output = _first(sources, "output_name", (("ss_output_name", _text(metadata.get("ss_output_name"))),
                                             ("modelspec.title", _text(metadata.get("modelspec.title"))),
                                             ("name", _text(metadata.get("name")))))
    dim = _first(sources, "network_dim", (("ss_network_dim", _number(metadata.get("ss_network_dim"))),))
    alpha = _first(sources, "network_alpha", (("ss_network_alpha", _number(metadata.get("ss_network_alpha"))),))
    module = _first(sources, "network_module", (("ss_network_module", _text(metadata.get("ss_network_module"))),))
    tags = tag_counts(metadata)
    triggers = _first(sources, "trigger_words", (
        ("modelspec.trigger_phrase", _phrases(metadata.get("modelspec.trigger_phrase"))),
        ("config.trigger_word", _phrases(_find(config, "trigger_word"))),
        ("ss_tag_frequency", top_tags(tags)),
        ("ss_dataset_dirs", folder_triggers(metadata))))
    trainer = _first(sources, "trainer", _trainers(metadata, module))
    settings = {k: str(v) for k, v in sorted(metadata.items()) if k.startswith(MUSUBI_H3_PREFIX)}
    return TrainingInfo(trainer=trainer, epoch=epoch, steps=steps, base_model=base, network_dim=dim,
                        network_alpha=alpha, network_module=module, output_name=output,
                        trigger_words=tuple(triggers or ()), tags=tuple(tags[:MAX_TAGS]), trainer_settings=settings,
                        sources=sources)


def trigger_word(info: Mapping[str, Any] | None) -> str | None:
    """The trigger word an inspect JSON offers for the prompt: the registry's (``known.trigger``, curated) else the
    file's first (``training.trigger_words``); None when neither gives one."""
    info = info or {}
    words = (info.get("training") or {}).get("trigger_words") or ()
    return (info.get("known") or {}).get("trigger") or (str(words[0]) if words else None)


def tag_counts(metadata: Mapping[str, str]) -> list[tuple[str, int]]:
    """``ss_tag_frequency`` (else ``ss_datasets[*].tag_frequency``) summed over datasets: ``(tag, count)``, most
    frequent first (ties in the order the file lists them)."""
    datasets = _json(metadata.get("ss_tag_frequency"))
    if not isinstance(datasets, Mapping):
        listed = _json(metadata.get("ss_datasets"))
        datasets = ({str(i): d.get("tag_frequency") for i, d in enumerate(listed) if isinstance(d, Mapping)}
                    if isinstance(listed, list) else {})
    totals: dict[str, int] = {}
    for tags in datasets.values():
        for tag, count in (tags.items() if isinstance(tags, Mapping) else ()):
            number = _int(count)
            if str(tag).strip() and number is not None and number > 0:
                totals[str(tag).strip()] = totals.get(str(tag).strip(), 0) + number
    return sorted(totals.items(), key=lambda item: -item[1])


def folder_triggers(metadata: Mapping[str, str]) -> tuple[str, ...]:
    """kohya's DreamBooth folders are named ``<repeats>_<instance prompt>`` (``10_ohwx man``): with no caption tags,
    the instance prompt is the trigger. From ``ss_dataset_dirs`` (``{folder: {n_repeats, img_count}}``)."""
    folders = _json(metadata.get("ss_dataset_dirs"))
    names = [_FOLDER.match(str(name).rsplit("/", 1)[-1]) for name in folders] if isinstance(folders, Mapping) else []
    return tuple(dict.fromkeys(m.group(1).strip() for m in names if m and m.group(1).strip()))[:MAX_TRIGGERS]


def top_tags(tags: list[tuple[str, int]]) -> tuple[str, ...]:
    """The tags tied for the highest count (a trigger word is in every caption), at most ``MAX_TRIGGERS``."""
    if not tags:
        return ()
    return tuple(tag for tag, count in tags if count == tags[0][1])[:MAX_TRIGGERS]


# ------------------------------------------------------------------------------------------------------- helpers
def _trainers(metadata: Mapping[str, str], module: str | None) -> Iterator[tuple[str, str | None]]:
    """``(metadata key, trainer)`` candidates in the order they are trusted."""
    software = _json(metadata.get("software"))
    name = _text(_get(software, "name")) if isinstance(software, Mapping) else _text(metadata.get("software"))
    if name:
        lowered = name.lower()
        yield "software", (AI_TOOLKIT if "ai-toolkit" in lowered else SIMPLETUNER if "simpletuner" in lowered
                           else name)
    yield "lycoris_config", SIMPLETUNER if "lycoris_config" in metadata else None
    yield "modelspec.implementation", (SIMPLETUNER if "simpletuner" in (metadata.get("modelspec.implementation") or
                                                                         "").lower() else None)
    yield MUSUBI_H3_PREFIX + "*", MUSUBI if any(k.startswith(MUSUBI_H3_PREFIX) for k in metadata) else None
    yield "ss_network_module", (MUSUBI if module and module.startswith(_MUSUBI_MODULES) else
                                LYCORIS if module and module.startswith("lycoris.") else None)
    yield "ss_*", KOHYA if any(k.startswith("ss_") for k in metadata) else None


def _first(sources: dict[str, str], name: str, candidates: Any) -> Any:
    """The first candidate ``(key, value)`` with a value; records its key in ``sources``."""
    for key, value in candidates:
        if value not in (None, "", ()):
            sources[name] = key
            return value
    return None


def _json(raw: str | None) -> Any:
    if not raw or not isinstance(raw, str):
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _get(data: Any, key: str) -> Any:
    return data.get(key) if isinstance(data, Mapping) else None


def _find(data: Any, key: str, depth: int = 0) -> Any:
    """The first value of ``key`` anywhere in nested JSON (ai-toolkit keeps ``trigger_word`` in a process entry)."""
    if depth > 8:
        return None
    if isinstance(data, Mapping):
        if data.get(key):
            return data[key]
        data = list(data.values())
    if isinstance(data, list):
        for item in data:
            found = _find(item, key, depth + 1)
            if found:
                return found
    return None


def _text(value: Any) -> str | None:
    text = str(value).strip() if value is not None else ""
    return text if text and text != "None" else None  # kohya stringifies every value: None is "None"


def _number(value: Any) -> float | None:
    try:
        number = float(str(value))
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _int(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number == int(number) and number >= 0 else None


def _phrases(value: Any) -> tuple[str, ...]:
    """A trigger phrase as written (one phrase; a list keeps each entry)."""
    values = value if isinstance(value, list) else [value]
    return tuple(t for t in (_text(v) for v in values) if t)


def _network_words(dim: float | None, alpha: float | None) -> str:
    if dim is None and alpha is None:
        return ""
    parts = [f"dim {dim:g}" if dim is not None else "", f"alpha {alpha:g}" if alpha is not None else ""]
    return "network " + " / ".join(p for p in parts if p) + " (trainer's setting, never applied)"
