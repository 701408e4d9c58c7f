"""A Hub catalog for the search tests, served by the local stand-in (``tests/hub_server.py``): MiniMax-H3 adapters
(registry repos with several files, a gated one, one without a ``.safetensors`` file), the base model itself, a
finetune of it, another model's LoRA and an untagged repo named like H3 — the last four must never be listed.

The weight files are the demo adapters (``assets/adapters``, made for the tiny checkpoint), so a check against the
tiny model loads them; ``NOT_H3`` is a LoRA for another model's layers.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from h3app.adapters.source.search import BASE_MODEL_TAG
from h3app.backend.service import DEMO_ADAPTERS_DIR

LIGHTX2V = "lightx2v/Minimax-h3-Turbo"
LARRY = "larryvrh/MiniMax-H3-Turbo-Lora"
STYLE = "someone/h3-style"  # gated
PICKLE = "someone/h3-pickle-only"  # no .safetensors file
NOT_H3_REPO = "someone/h3-broken"  # tagged as an H3 adapter, but its file targets another model
BASE = "MiniMaxAI/MiniMax-H3"
FINETUNE = "someone/h3-finetune"
WAN_LORA = "someone/wan-turbo-lora"
UNTAGGED = "someone/MiniMax-H3-Turbo-notes"
GATED_TOKEN = "hf_visitor_accepted_terms"

# repo → (files: name → demo adapter copied, card)
H3_ADAPTERS = {
    LIGHTX2V: ({"h3_fl2v_4step_v0.1.safetensors": "lightx2v_turbo_no_alpha.safetensors",
                "h3_t2v_4step_v0.1.safetensors": "lightx2v_turbo_no_alpha.safetensors",
                "h3_t2v_8step_544p.safetensors": "peft_diffusers_metadata.safetensors"},
               {"downloads": 900, "likes": 10, "last_modified": "2025-03-01T00:00:00.000Z"}),
    LARRY: ({"minimax_h3_turbo_v4_step600_ema.safetensors": "native_larry_mixed_rank.safetensors",
             "minimax_h3_turbo_4step_ema_ckpt500.safetensors": "native_comfyui_alpha.safetensors"},
            {"downloads": 500, "likes": 40, "last_modified": "2025-06-01T00:00:00.000Z"}),
    STYLE: ({"style.safetensors": "kohya_musubi.safetensors"},
            {"downloads": 100, "likes": 5, "last_modified": "2025-08-01T00:00:00.000Z"}),
    PICKLE: ({"lora.bin": None}, {"downloads": 10, "likes": 1, "last_modified": "2025-02-01T00:00:00.000Z"}),
    NOT_H3_REPO: ({"other.safetensors": "NOT_H3"}, {"downloads": 5, "likes": 0,
                                                     "last_modified": "2025-01-15T00:00:00.000Z"}),
}
NOT_LISTED = {  # repo → tags: never an adapter of MiniMax-H3
    BASE: ["diffusers", "text-to-video"],
    FINETUNE: ["base_model:finetune:" + BASE, "base_model:" + BASE],
    WAN_LORA: ["lora", "base_model:adapter:Wan-AI/Wan2.2-T2V-A14B"],
    UNTAGGED: ["lora"],
}


def not_h3_lora(path: Path) -> None:
    """A small LoRA whose keys name another model's layers (a UNet's)."""
    save_file({"lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight": torch.zeros(4, 32),
               "lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight": torch.zeros(32, 4)}, str(path))


def serve_catalog(hub, root: Path) -> dict[str, dict[str, int]]:
    """Add every repo of the catalog to ``hub`` (folders under ``root``); returns repo → {weight file: size}."""
    sizes: dict[str, dict[str, int]] = {}
    for repo_id, (files, card) in H3_ADAPTERS.items():
        folder = root / repo_id.replace("/", "--")
        folder.mkdir(parents=True)
        (folder / "README.md").write_text(f"# {repo_id}\n")
        for name, demo in files.items():
            if demo is None:
                (folder / name).write_bytes(b"\0" * 64)
            elif demo == "NOT_H3":
                not_h3_lora(folder / name)
            else:
                shutil.copyfile(DEMO_ADAPTERS_DIR / demo, folder / name)
        hub.add_repo(repo_id, folder, gated_token=GATED_TOKEN if repo_id == STYLE else None)
        hub.set_card(repo_id, tags=["lora", BASE_MODEL_TAG, "base_model:" + BASE], **card)
        sizes[repo_id] = {n: (folder / n).stat().st_size for n in files if n.endswith(".safetensors")}
    for repo_id, tags in NOT_LISTED.items():
        folder = root / repo_id.replace("/", "--")
        folder.mkdir(parents=True)
        shutil.copyfile(DEMO_ADAPTERS_DIR / "kohya_musubi.safetensors", folder / "weights.safetensors")
        hub.add_repo(repo_id, folder)
        hub.set_card(repo_id, tags=tags, downloads=99_999, likes=999, last_modified="2025-12-01T00:00:00.000Z")
    return sizes
