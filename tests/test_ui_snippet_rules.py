""""Copy as CLI" snippets against the runtimes' own rules: the diffusers snippet's export names the partition the run
used; the sglang command reproduces h3app's per-module scales, or says in one sentence why no command can."""

from __future__ import annotations

from h3app.ui.presenters import snippets


def _settings(workflow: str = "t2va", **adapter) -> dict:
    base = {"source": "owner/repo", "weight_name": "lora.safetensors", "revision": None, "commit": None,
            "rank": 4, "alpha": None, "resolved_alpha": 4.0, "alpha_source": "rank_fallback", "strength": 1.0,
            "mode": "unmerged"}
    return {"model": "MiniMaxAI/MiniMax-H3", "request": {"prompt": "p", "seed": 1, "steps": 5, "duration": 5.0,
                                                          "workflow": workflow, "references": []},
            "adapters": [{**base, **adapter}]}


def test_diffusers_snippet_exports_the_reference_partition_for_ref2va():
    text = snippets.diffusers_snippet(_settings("ref2va"))
    assert "--partition transformer_ref" in text
    compile(text, "<snippet>", "exec")
    assert "--partition" not in snippets.diffusers_snippet(_settings("t2va"))


# ------------------------------------------------------------------------------------------------- sglang
# Each case is a real file inspected by h3app; the expected flags follow from sglang's rules by hand (comments).
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from adapter_fixtures import TINY_SHAPES, diffusers_targets, save  # noqa: E402

from h3app.adapters.inspect import inspect_file  # noqa: E402
from h3app.adapters.normalise import load_adapter  # noqa: E402
from h3app.rules.scale import effective_scale  # noqa: E402

BLOCK = "transformer_blocks.0"
TARGETS = (f"{BLOCK}.attn.to_q", f"{BLOCK}.attn.to_k", f"{BLOCK}.attn.to_v", f"{BLOCK}.attn.to_out.0",
           f"{BLOCK}.ff.net.0.proj", f"{BLOCK}.ff.net.2")


def _file(tmp_path: Path, alphas: dict[str, float] | None = None, config: dict | None = None) -> Path:
    tensors = diffusers_targets("", TARGETS, rank=4)
    for target, alpha in (alphas or {}).items():
        tensors[f"{target}.alpha"] = torch.tensor(alpha)
    path = save(tmp_path / "lora" / "adapter_model.safetensors", tensors)
    sidecar = path.parent / "adapter_config.json"
    if config is not None:
        sidecar.write_text(json.dumps(config))
    elif sidecar.exists():
        sidecar.unlink()
    return path


def _run(path: Path, alpha: float | None = None, strength: float = 1.0):
    """The sglang command for a run of ``path`` at (alpha, strength), and h3app's effective scale per target
    as the normalised adapter (what the engine applies) gives it."""
    info = inspect_file(path, shapes=TINY_SHAPES).to_json()
    adapter = load_adapter(path, shapes=TINY_SHAPES, explicit_alpha=alpha)
    h3app = {t: effective_scale(m.alpha, strength, m.rank, m.use_rslora) for t, m in adapter.modules.items()}
    settings = _settings(alpha=alpha, strength=strength, rank=4, resolved_alpha=adapter.info.alpha)
    return snippets.sglang_command(settings, [info]), h3app


def _flags(command: str) -> tuple[int | None, float]:
    words = command.replace("\\\n", " ").split()
    alpha = int(words[words.index("--lora-alpha") + 1]) if "--lora-alpha" in words else None
    return alpha, float(words[words.index("--lora-scale") + 1])


def _one_sentence(text: str) -> None:
    assert text.startswith("No sglang command reproduces this run: ") and text.endswith(".")
    assert "\n" not in text and ". " not in text


def test_plain_file_explicit_alpha_is_passed_through(tmp_path: Path):
    result, h3app = _run(_file(tmp_path), alpha=8.0, strength=0.5)
    assert _flags(result.command) == (8, 0.5)  # sglang: 0.5 × 8 / 4 = h3app's 1.0 on every module
    assert set(h3app.values()) == {1.0} and result.notes == ()


def test_alpha_pattern_wins_over_lora_alpha_so_the_scale_compensates(tmp_path: Path):
    config = {"r": 4, "lora_alpha": 4, "alpha_pattern": {"to_out.0": 2, "ff.net.2": 2}}
    result, h3app = _run(_file(tmp_path, config=config), alpha=8.0)
    # h3app: explicit 8 everywhere → 2.0. sglang: alpha_pattern makes to_out.0 / ff.net.2 alpha 2 whatever
    # --lora-alpha says → --lora-scale 4 (4 × 2 / 4 = 2); the rest then need --lora-alpha 2 (4 × 2 / 4 = 2).
    assert set(h3app.values()) == {2.0}
    assert _flags(result.command) == (2, 4.0)
    # Without an explicit alpha h3app runs the pattern itself: 2 / 4 there, 4 / 4 elsewhere; sglang the same.
    result, h3app = _run(_file(tmp_path, config=config))
    assert h3app[f"{BLOCK}.attn.to_out.0"] == 0.5 and h3app[f"{BLOCK}.attn.to_q"] == 1.0
    assert _flags(result.command) == (4, 1.0)


def test_non_integer_alpha_pattern_or_lora_alpha_has_no_command(tmp_path: Path):
    for config, shown in (({"r": 4, "lora_alpha": 12.5}, "adapter_config.json lora_alpha is 12.5"),
                          ({"r": 4, "lora_alpha": 4, "alpha_pattern": {"to_out.0": 2.5}},
                           "alpha_pattern['to_out.0'] is 2.5")):
        for alpha in (None, 8.0):  # whatever --lora-alpha says
            result, _ = _run(_file(tmp_path, config=config), alpha=alpha)
            assert result.notes == (result.command.removeprefix("# "),)
            _one_sentence(result.notes[0])
            assert shown in result.notes[0] and "positive integer" in result.notes[0]
            assert "--lora-path" not in result.command


def test_non_integer_metadata_lora_alpha_has_no_command(tmp_path: Path):
    tensors = diffusers_targets("transformer.", TARGETS, rank=4)
    meta = {"lora_adapter_metadata": json.dumps({"transformer.r": 4, "transformer.lora_alpha": 6.5})}
    result, _ = _run(save(tmp_path / "m.safetensors", tensors, meta), alpha=4.0)
    _one_sentence(result.notes[0])
    assert "lora_adapter_metadata lora_alpha is 6.5" in result.notes[0]


def test_fractional_alpha_tensors_are_truncated_by_sglang(tmp_path: Path):
    # 1.5 on the modules sglang keeps separate (no q/k/v LoRA): it runs int(1.5) = 1 whatever --lora-alpha says,
    # so --lora-scale 1.5 restores h3app's 1.5 / 4.
    tensors = diffusers_targets("", TARGETS[3:], rank=4)
    tensors |= {f"{t}.alpha": torch.tensor(1.5) for t in TARGETS[3:]}
    result, h3app = _run(save(tmp_path / "u.safetensors", tensors))
    assert set(h3app.values()) == {1.5 / 4}
    assert _flags(result.command) == (None, 1.5) and result.notes == ()
    # 1.5 and 2.5 truncate to 1 and 2: the two need --lora-scale 1.5 and 1.25, so no command exists.
    tensors[f"{TARGETS[5]}.alpha"] = torch.tensor(2.5)
    result, _ = _run(save(tmp_path / "m.safetensors", tensors))
    _one_sentence(result.notes[0])
    assert ".alpha tensors" in result.notes[0] and "int()-truncated" in result.notes[0]


def test_a_q_k_v_section_alpha_is_folded_exactly_but_three_cannot_be_read(tmp_path: Path):
    # One section's fractional alpha: sglang folds it into that section's factors exactly, the other sections
    # (no tensor) take --lora-alpha; h3app runs them at alpha = rank, so --lora-alpha 4 --lora-scale 1.
    result, h3app = _run(_file(tmp_path, alphas={TARGETS[0]: 1.5}))
    assert h3app[TARGETS[0]] == 1.5 / 4 and h3app[TARGETS[1]] == 1.0
    assert _flags(result.command) == (4, 1.0)
    result, _ = _run(_file(tmp_path, alphas={t: 2.0 for t in TARGETS[:3]}))
    _one_sentence(result.notes[0])
    assert "to_q/to_k/to_v" in result.notes[0]


def test_alpha_pattern_that_contradicts_a_tensor_is_refused_by_sglang(tmp_path: Path):
    config = {"r": 4, "lora_alpha": 4, "alpha_pattern": {"to_out.0": 2}}
    result, _ = _run(_file(tmp_path, alphas={TARGETS[3]: 3.0}, config=config))
    _one_sentence(result.notes[0])
    assert "alpha_pattern gives" in result.notes[0]


def test_fractional_explicit_alpha_uses_the_integer_equivalent(tmp_path: Path):
    result, h3app = _run(_file(tmp_path), alpha=2.5)
    assert _flags(result.command) == (4, 0.625)  # 0.625 × 4 / 4 = 2.5 / 4
    assert any("not bit-identical" in n for n in result.notes)


def test_a_hub_url_source_is_given_to_sglang_as_the_repo_with_the_full_weight_path():
    settings = _settings(source="https://huggingface.co/ORG/REPO/tree/main/adapters",
                         weight_name="adapters/x.safetensors", alpha=8.0)
    command = snippets.sglang_command(settings).command
    assert "--lora-path ORG/REPO" in command and "--lora-weight-name adapters/x.safetensors" in command
