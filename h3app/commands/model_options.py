"""Command-line flags that choose and place the model, shared by the commands that load one."""

from __future__ import annotations

import argparse
import os

from ..model import repo
from ..model.loader import OFFLOAD_MODES, LoadOptions, parse_dtype


def add_model_flags(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument("--model", default=None if required else os.environ.get("H3APP_MODEL", repo.TINY),
                        required=required,
                        help="`tiny` (embedded checkpoint), a local folder, or a Hub repo id such as MiniMaxAI/MiniMax-H3")
    parser.add_argument("--model-revision", default=None, help="Hub revision of the model (branch, tag or commit)")
    parser.add_argument("--dtype", default="float32", help="float32 (CPU default) or bfloat16 (GPU)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 …")
    parser.add_argument("--offload", default="none", choices=OFFLOAD_MODES,
                        help="none | auto (ComponentsManager CPU offload) | group (transformer block offload)")
    parser.add_argument("--fuse-qkv", action="store_true", help="fuse q/k/v at load time (frees the split weights)")
    parser.add_argument("--int8", action="store_true", help="int8 transformer weights via torchao (LoRA unmerged-only)")


def load_options(args: argparse.Namespace) -> LoadOptions:
    return LoadOptions(dtype=parse_dtype(args.dtype), device=args.device, offload=args.offload, int8=args.int8,
                       fuse_qkv=args.fuse_qkv, revision=args.model_revision, token=os.environ.get("HF_TOKEN"))
