""""Copy as CLI" snippets against the runtimes' own rules: the diffusers snippet's export names the partition the run
used; the sglang command reproduces h3app's per-module scales, or says in one sentence why no command can."""

from __future__ import annotations

from h3app.ui import snippets


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
