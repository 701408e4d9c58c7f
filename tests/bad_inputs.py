"""The bad-input corpus: every way a stranger's adapter (or its settings) can be wrong, made in code into a folder.

Run ``python tests/bad_inputs.py OUT_DIR`` to write the corpus and print one line per entry; the reliability tests
(tests/test_reliability_*.py) call :func:`make_corpus` on a tmp folder. Nothing here is a hand-copied binary: every
file is built from tiny tensors, ``struct``-packed headers, ``torch.save``/``pickle`` (pickles are only *written*,
never loaded) or plain text, for the tiny H3 transformer of ``assets/tiny-h3``.

An entry (:class:`BadInput`) says what to pass (``source``, ``weight_name``, ``revision``, ``alpha``, ``strength``),
how far a correct h3app gets before refusing it (``stage``, one of :data:`STAGES`) and a regex the one-line refusal
must match — the words that name the problem. :func:`make_accepted` writes inputs that look odd but are valid and must
be applied (a stored alpha of 0 means alpha = rank, with a warning). :func:`corpus_entries` lists the entries without
writing anything (for pytest's collection); ``BadInput.resolve(folder)`` points one at a written corpus.
"""

from __future__ import annotations

import json
import math
import pickle
import struct
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make h3app and the sibling fixtures importable
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from adapter_fixtures import TINY_CONFIG, factors, lora_keys  # noqa: E402
from safetensors.torch import save as save_bytes  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

# How far a correct h3app gets before refusing an entry:
#   "settings": the adapter settings themselves (alpha, scale) — refused before any file is touched;
#   "source":   the SOURCE / weight name / revision text, or the file is not where it says — refused before reading;
#   "header":   the header, key names or shapes — ``inspect`` (header only) already refuses it;
#   "load":     the header is fine but the tensors are not (NaN/Inf), or nothing applies to the workflow's
#               partition — ``inspect`` (header only) passes, loading refuses;
#   "hosted":   only a public server refuses it (local paths outside its allow-list).
STAGES = ("settings", "source", "header", "load", "hosted")
NONEXISTENT_REPO = "h3app-nobody/no-such-adapter-repo"
CORPUS = "<corpus>/"  # placeholder for the corpus folder in entries listed without writing (corpus_entries)


@dataclass(frozen=True)
class BadInput:
    """One corpus entry: what to pass, where it must be refused, and what the one-line message must say."""

    kind: str
    what: str
    source: str
    stage: str
    expect: str  # regex (case-insensitive) that the one-line message must match
    weight_name: str | None = None
    revision: str | None = None
    alpha: Any = None
    strength: Any = 1.0
    cli_expect: str | None = None  # when the CLI's own parser words it differently (e.g. "invalid float value")

    def resolve(self, folder: str | Path) -> BadInput:
        """This entry with a ``CORPUS`` placeholder source replaced by the path under ``folder``."""
        if not self.source.startswith(CORPUS):
            return self
        return replace(self, source=str(Path(folder).resolve() / self.source[len(CORPUS):]))

    def cli_file_args(self) -> list[str]:
        """``[--weight-name F] [--revision R]``: which file of the source, as every command names it."""
        args = []
        if self.weight_name is not None:
            args += ["--weight-name", self.weight_name]
        if self.revision is not None:
            args += ["--revision", self.revision]
        return args

    def cli_adapter_args(self) -> list[str]:
        """``--adapter SOURCE [--weight-name F] [--revision R]`` for ``generate`` (alpha/scale given separately)."""
        return ["--adapter", self.source, *self.cli_file_args()]

    def cli_inspect_args(self) -> list[str]:
        return ["inspect", self.source, *self.cli_file_args()]


@dataclass(frozen=True)
class Accepted:
    """A valid-but-unusual input that must be applied, with a warning matching ``warning``."""

    kind: str
    what: str
    source: str
    warning: str


# ------------------------------------------------------------------------------------------------- byte builders
def raw_safetensors(header: Mapping[str, Any] | bytes, data: bytes = b"", *, declared_length: int | None = None,
                    pad: bool = True) -> bytes:
    """A safetensors container by hand: 8-byte little-endian header length, the header, then ``data``.

    ``header`` is a dict (JSON-encoded) or raw bytes; ``declared_length`` overrides the length field (to lie).
    """
    raw = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    length = len(raw) if declared_length is None else declared_length
    return struct.pack("<Q", length) + raw + data


def f32_entries(shapes: Mapping[str, tuple[int, ...]], value: float = 0.01) -> tuple[dict[str, Any], bytes]:
    """A header dict (F32 tensors laid end to end) and the matching data bytes, every element ``value``."""
    header: dict[str, Any] = {}
    data = bytearray()
    for key, shape in shapes.items():
        count = math.prod(shape)
        header[key] = {"dtype": "F32", "shape": list(shape), "data_offsets": [len(data), len(data) + 4 * count]}
        data += struct.pack(f"<{count}f", *([value] * count))
    return header, bytes(data)


def native_factors(modules: Mapping[str, tuple[int, int]], rank: int = 4, style: str = "ab",
                   seed: int = 0) -> dict[str, torch.Tensor]:
    """Random lora_A/lora_B (``style="du"``: lora_down/lora_up) factors for each module name → its (out, in)."""
    tensors: dict[str, torch.Tensor] = {}
    for offset, (name, (out_features, in_features)) in enumerate(modules.items()):
        down, up = factors(out_features, in_features, rank, seed=seed + offset)
        tensors.update(lora_keys(name, down * 0.1, up * 0.1, style))
    return tensors


def good_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """A small valid native LoRA for the tiny transformer: block 0's attention and FFN, rank 4."""
    return native_factors({
        "blocks.0.attn.qkv_proj": (96, 24), "blocks.0.attn.out_proj": (24, 32),
        "blocks.0.mlp.fc1": (64, 24), "blocks.0.mlp.fc2": (24, 32),
    }, seed=seed)


def _save(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.clone().contiguous() for k, v in tensors.items()}, str(path),
              metadata=dict(metadata) if metadata else None)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


class _Files:
    """Writes corpus files under ``root`` and returns their absolute paths; with ``root=None`` writes nothing and
    returns ``CORPUS + name`` placeholders (the entry list alone, cheap enough for pytest's collection)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root

    def call(self, name: str, build: Callable[[Path], Any]) -> str:
        if self.root is None:
            return CORPUS + name
        path = self.root / name
        build(path)
        return str(path)

    def bytes(self, name: str, data: bytes) -> str:
        return self.call(name, lambda path: _write(path, data))

    def tensors(self, name: str, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> str:
        return self.call(name, lambda path: _save(path, tensors, metadata))


# --------------------------------------------------------------------------------------------------- the corpus
def corpus_entries() -> list[BadInput]:
    """The entries without writing anything: local sources are ``CORPUS``-prefixed placeholders (see ``resolve``)."""
    return make_corpus(None)


def make_corpus(folder: str | Path | None) -> list[BadInput]:
    """Write every corpus file under ``folder`` and return the entries (sources: absolute paths or repo ids).

    ``folder=None`` writes nothing and leaves ``CORPUS`` placeholders in the sources.
    """
    root = Path(folder).resolve() if folder is not None else None
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
    files = _Files(root)
    good = good_tensors()
    entries: list[BadInput] = []

    def add(kind: str, what: str, source: str, stage: str, expect: str, **extra: Any) -> None:
        entries.append(BadInput(kind, what, source, stage, expect, **extra))

    good_path = files.tensors("good_for_settings.safetensors", good)

# --- the container: not safetensors at all, or a damaged one ------------------------------------------------
    add("empty_file", "a 0-byte .safetensors", files.bytes("empty.safetensors", b""), "header", r"empty")
    good_bytes = save_bytes({k: v.clone().contiguous() for k, v in good.items()})  # what save_file writes
    add("truncated", "a valid adapter cut 100 bytes short (an interrupted copy)",
        files.bytes("truncated.safetensors", good_bytes[:-100]), "header", r"truncated")
    add("header_length_beyond_file", "the 8-byte length claims a 4096-byte header in a 16-byte file",
        files.bytes("header_beyond_file.safetensors", raw_safetensors(b"{}", declared_length=4096)), "header",
        r"truncated")
    add("header_over_100mb", "the 8-byte length claims a 200 MB header (only those 8 bytes are written)",
        files.bytes("header_200mb.safetensors", struct.pack("<Q", 200_000_000)), "header",
        r"200,000,000-byte header|header.*limit")
    add("header_not_json", "the header is plain text, not JSON",
        files.bytes("header_text.safetensors", raw_safetensors(b"this is not json at all")), "header",
        r"not a JSON object|not valid JSON")
    add("header_broken_json", "the header starts like JSON and breaks off",
        files.bytes("header_broken.safetensors", raw_safetensors(b'{"a": {"dtype": "F32", "sha')), "header",
        r"not valid JSON")
    add("header_not_utf8", "the header is binary garbage",
        files.bytes("header_binary.safetensors", raw_safetensors(bytes(range(128, 256)))), "header", r"UTF-8")
    add("header_json_array", "the header is a JSON array",
        files.bytes("header_array.safetensors", raw_safetensors(b"[1, 2, 3]")), "header", r"not a JSON object")
    add("header_no_tensors", "a well-formed header with no tensors",
        files.bytes("no_tensors.safetensors", raw_safetensors(b"{}")), "header", r"no tensors")
    header, data = f32_entries({"blocks.0.attn.out_proj.lora_A.weight": (4, 32),
                                "blocks.0.attn.out_proj.lora_B.weight": (24, 4)})
    overlapping = json.loads(json.dumps(header))
    overlapping["blocks.0.attn.out_proj.lora_B.weight"]["data_offsets"] = [256, 256 + 384]  # starts inside A
    add("overlapping_offsets", "B's data_offsets start inside A's bytes",
        files.bytes("overlap.safetensors", raw_safetensors(overlapping, data[:256 + 384])), "header",
        r"holes or overlaps")
    holey = json.loads(json.dumps(header))
    holey["blocks.0.attn.out_proj.lora_B.weight"]["data_offsets"] = [512 + 64, 512 + 64 + 384]  # 64-byte gap
    add("holey_offsets", "a 64-byte hole between A and B",
        files.bytes("hole.safetensors", raw_safetensors(holey, data[:512] + b"\0" * 64 + data[512:])), "header",
        r"holes or overlaps")
    add("trailing_bytes", "1 kB of junk after the last tensor",
        files.bytes("trailing.safetensors", raw_safetensors(header, data + b"\0" * 1024)), "header",
        r"bytes after the end")
    wrong_size = json.loads(json.dumps(header))
    wrong_size["blocks.0.attn.out_proj.lora_A.weight"]["shape"] = [4, 3200]
    add("shape_exceeds_bytes", "a tensor's shape needs 100× the bytes its offsets give",
        files.bytes("shape_bytes.safetensors", raw_safetensors(wrong_size, data)), "header", r"occupies")
    unknown = json.loads(json.dumps(header))
    unknown["blocks.0.attn.out_proj.lora_A.weight"]["dtype"] = "F128"
    add("unknown_dtype", "dtype F128 (not a safetensors dtype)",
        files.bytes("unknown_dtype.safetensors", raw_safetensors(unknown, data)), "header", r"unknown dtype")
    listed = json.loads(json.dumps(header))
    listed["blocks.0.attn.out_proj.lora_A.weight"]["dtype"] = ["F32"]
    add("header_dtype_not_a_string", "a tensor's dtype is a JSON list, not a string",
        files.bytes("dtype_list.safetensors", raw_safetensors(listed, data)), "header", r"dtype")
    duplicated = raw_safetensors(
        b'{"k.lora_A.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        b'"k.lora_A.weight":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8)
    add("duplicate_header_key", "the same tensor name twice in the header JSON",
        files.bytes("duplicate_key.safetensors", duplicated), "header", r"twice")
    add("metadata_not_strings", "__metadata__ maps a name to a number",
        files.bytes("metadata_number.safetensors", raw_safetensors({"__metadata__": {"alpha": 8}, **header}, data)),
        "header", r"__metadata__")
    add("html_page", "an HTML login page saved as .safetensors",
        files.bytes("html_page.safetensors",
               b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>Please log in</body></html>\n"),
        "header", r"HTML page")
    add("git_lfs_pointer", "a git-lfs pointer file saved as .safetensors",
        files.bytes("lfs_pointer.safetensors",
               b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"ab" * 32 + b"\nsize 123456789\n"),
        "header", r"git-lfs pointer")

    # --- pickles: refused by name or by their first bytes, never loaded ------------------------------------------
    def torch_pickle(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(good, path)

    def raw_pickle(protocol: int) -> bytes:
        return pickle.dumps({"state_dict": {k: v.numpy() for k, v in good.items()}}, protocol=protocol)

    add("pickle_bin", "a torch.save pickle named .bin", files.call("adapter.bin", torch_pickle), "source", r"pickle")
    add("pickle_pt", "a torch.save pickle named .pt", files.call("adapter.pt", torch_pickle), "source", r"pickle")
    add("pickle_ckpt", "a plain pickle named .ckpt", files.bytes("adapter.ckpt", raw_pickle(4)), "source", r"pickle")
    add("pickle_renamed_zip", "a torch.save (zip) pickle renamed to .safetensors",
        files.call("zip_pickle_renamed.safetensors", torch_pickle), "header", r"pickle")
    add("pickle_renamed_raw", "a protocol-2 pickle renamed to .safetensors",
        files.bytes("raw_pickle_renamed.safetensors", raw_pickle(2)), "header", r"pickle")

    # --- not an H3 LoRA ------------------------------------------------------------------------------------------
    def h3_checkpoint(path: Path) -> None:
        from diffusers import MiniMaxH3Transformer3DModel

        torch.manual_seed(0)
        _save(path, MiniMaxH3Transformer3DModel(**TINY_CONFIG).state_dict())

    add("full_h3_checkpoint", "the tiny H3 transformer's own weights (no LoRA keys)",
        files.call("h3_checkpoint.safetensors", h3_checkpoint), "header", r"checkpoint, not an adapter")
    wan = native_factors({"diffusion_model.blocks.0.self_attn.q": (64, 64),
                          "diffusion_model.blocks.0.cross_attn.k": (64, 64),
                          "diffusion_model.blocks.0.ffn.0": (128, 64)})
    add("wan_lora", "a Wan 2.x LoRA (self_attn/cross_attn/ffn)", files.tensors("wan_lora.safetensors", wan), "header",
        r"\bWan\b")
    flux = native_factors({"transformer.single_transformer_blocks.0.attn.to_q": (64, 64),
                           "transformer.single_transformer_blocks.0.proj_out": (64, 128),
                           "transformer.transformer_blocks.0.attn.add_q_proj": (64, 64)})
    add("flux_lora", "a Flux LoRA (diffusers names with single_transformer_blocks)",
        files.tensors("flux_lora.safetensors", flux), "header", r"Flux")
    hunyuan = native_factors({"diffusion_model.double_blocks.0.img_attn_qkv": (192, 64),
                              "diffusion_model.double_blocks.0.txt_mod.linear": (384, 64),
                              "diffusion_model.single_blocks.0.linear1": (256, 64)}, style="du")
    add("hunyuanvideo_lora", "a HunyuanVideo LoRA (img_attn_qkv, txt_mod)",
        files.tensors("hunyuan_lora.safetensors", hunyuan), "header", r"HunyuanVideo")
    unknown_names = native_factors({"encoder.layers.0.self_attn.q_proj": (24, 24)})
    add("unknown_module_names", "LoRA factors for module names H3 does not have (a text-encoder LoRA)",
        files.tensors("unknown_names.safetensors", unknown_names), "header", r"none of its .* keys names an H3 module")
    pruned = native_factors({"blocks.0.attn.qkv_proj": (96, 24), "blocks.0.adaln_proj.linear": (216, 16),
                             "blocks.1.adaln_proj.linear": (216, 16), "final_layer.adaln_proj.linear": (24, 16)})
    add("pruned_h3_lora", "a LoRA for a pruned H3 (AdaLN projections half as wide as the model's)",
        files.tensors("pruned_h3.safetensors", pruned), "header", r"does not fit the model")
    too_wide = native_factors({"blocks.0.attn.out_proj": (5120, 5120)}, rank=1)
    add("full_size_lora_on_tiny", "a LoRA for the full-size H3 (hidden 5120) on the tiny model",
        files.tensors("full_size_on_tiny.safetensors", too_wide), "header", r"does not fit the model")
    ref_only = native_factors({"transformer_ref.blocks.0.attn.out_proj": (24, 32)})
    add("reference_partition_only", "every key is for transformer_ref; the t2va workflow uses transformer",
        files.tensors("ref_only.safetensors", ref_only), "load", r"transformer_ref|ref2va")

    # --- other adapter families ----------------------------------------------------------------------------------
    # LoKr and LoHa load (tests/test_adapters_lycoris.py); these are broken ones.
    lokr_misfit = {"blocks.0.attn.out_proj.lokr_w1": torch.randn(4, 4), "blocks.0.attn.out_proj.lokr_w2": torch.randn(6, 7)}
    add("lokr_misfit", "a LyCORIS LoKr whose kron(W1, W2) is 24×28 on a 24×32 layer",
        files.tensors("lokr_misfit.safetensors", lokr_misfit), "header", r"does not fit the model")
    lokr_fp8 = {"blocks.0.attn.out_proj.lokr_w1": torch.randn(4, 4).to(torch.float8_e4m3fn),
                "blocks.0.attn.out_proj.lokr_w2": torch.randn(6, 8)}
    add("lokr_fp8", "a LyCORIS LoKr with an fp8 factor", files.tensors("lokr_fp8.safetensors", lokr_fp8), "header",
        r"F8_E4M3.*quantised")
    lokr_tucker = {"blocks.0.attn.out_proj.lokr_w1": torch.randn(4, 4), "blocks.0.attn.out_proj.lokr_t2": torch.randn(2, 2, 1, 1),
                   "blocks.0.attn.out_proj.lokr_w2_a": torch.randn(2, 6), "blocks.0.attn.out_proj.lokr_w2_b": torch.randn(2, 8)}
    add("lokr_tucker", "a LyCORIS LoKr with a Tucker core (conv)", files.tensors("lokr_tucker.safetensors", lokr_tucker),
        "header", r"Tucker.*conv")
    loha_nan = {f"blocks.0.attn.out_proj.hada_{p}": torch.randn(24 if p.endswith("a") else 4, 4 if p.endswith("a") else 32)
                for p in ("w1_a", "w1_b", "w2_a", "w2_b")}
    loha_nan["blocks.0.attn.out_proj.hada_w2_b"][0, 0] = float("nan")
    add("loha_nan", "a LyCORIS LoHa with a NaN in a factor", files.tensors("loha_nan.safetensors", loha_nan), "load",
        r"NaN")
    dora = {**native_factors({"transformer_blocks.0.attn.to_out.0": (24, 32)}),
            "transformer_blocks.0.attn.to_out.0.lora_magnitude_vector": torch.ones(23)}
    add("dora_magnitude_length", "a PEFT DoRA whose magnitude has 23 values for a 24-row layer",
        files.tensors("dora.safetensors", dora), "header", r"DoRA magnitude holds one value per output row")
    full_diff = {**native_factors({"blocks.0.attn.out_proj": (24, 32)}),
                 "blocks.0.attn.out_proj.diff": torch.zeros(24, 32), "blocks.0.attn.out_proj.diff_b": torch.zeros(24)}
    add("full_diff", "an exact .diff_b for attn.to_out.0.bias, a parameter H3 does not have (exact parts bind only to real ones)",
        files.tensors("full_diff.safetensors", full_diff), "header", r"diff_b part .* does not have")

    # --- LoRA factors that do not belong together ----------------------------------------------------------------
    a_only = {k: v for k, v in good.items() if not k.startswith("blocks.0.attn.out_proj.lora_B")}
    add("a_without_b", "blocks.0.attn.out_proj has lora_A and no lora_B",
        files.tensors("a_without_b.safetensors", a_only), "header", r"no lora_B")
    b_only = {k: v for k, v in good.items() if not k.startswith("blocks.0.mlp.fc2.lora_A")}
    add("b_without_a", "blocks.0.mlp.fc2 has lora_B and no lora_A",
        files.tensors("b_without_a.safetensors", b_only), "header", r"no lora_A")
    rank_mismatch = {**good, "blocks.0.attn.out_proj.lora_B.weight": torch.randn(24, 3) * 0.1}
    add("rank_a_ne_rank_b", "lora_A has rank 4, lora_B rank 3",
        files.tensors("rank_mismatch.safetensors", rank_mismatch), "header", r"rank 4 but lora_B rank 3")
    rank_zero = {"blocks.0.attn.out_proj.lora_A.weight": torch.zeros(0, 32),
                 "blocks.0.attn.out_proj.lora_B.weight": torch.zeros(24, 0)}
    add("rank_zero", "rank-0 factors", files.tensors("rank_zero.safetensors", rank_zero), "header", r"rank 0")
    stacks = {"blocks.0.attn.qkv_proj.lora_A.weight": torch.randn(2, 4, 24) * 0.1,
              "blocks.0.attn.qkv_proj.lora_B.weight": torch.randn(2, 32, 4) * 0.1}
    add("stack_two_groups", "3D qkv stacks with 2 groups (q, k, v needs 3)",
        files.tensors("stack_2_groups.safetensors", stacks), "header", r"2 lora_A and 2 lora_B groups")
    stacks_mixed = {"blocks.0.attn.qkv_proj.lora_A.weight": torch.randn(3, 4, 24) * 0.1,
                    "blocks.0.attn.qkv_proj.lora_B.weight": torch.randn(4, 32, 4) * 0.1}
    add("stack_group_counts_differ", "3D qkv stacks with 3 lora_A groups and 4 lora_B groups",
        files.tensors("stack_3_vs_4.safetensors", stacks_mixed), "header", r"3 lora_A and 4 lora_B groups")
    stack_not_qkv = {"blocks.0.attn.out_proj.lora_A.weight": torch.randn(3, 4, 32) * 0.1,
                     "blocks.0.attn.out_proj.lora_B.weight": torch.randn(3, 24, 4) * 0.1}
    add("stack_on_plain_linear", "3D stacks on out_proj (only a fused QKV may be stacked)",
        files.tensors("stack_out_proj.safetensors", stack_not_qkv), "header", r"only a fused QKV")
    qkv_rows = {"blocks.0.attn.qkv_proj.lora_A.weight": torch.randn(4, 24) * 0.1,
                "blocks.0.attn.qkv_proj.lora_B.weight": torch.randn(95, 4) * 0.1}
    add("qkv_rows_not_divisible", "fused QKV lora_B with 95 rows (not 3 × something)",
        files.tensors("qkv_95_rows.safetensors", qkv_rows), "header", r"not divisible by 3")
    mixed_styles = {"blocks.0.attn.out_proj.lora_A.weight": good["blocks.0.attn.out_proj.lora_A.weight"],
                    "blocks.0.attn.out_proj.lora_up.weight": good["blocks.0.attn.out_proj.lora_B.weight"]}
    add("mixed_suffix_styles", "one module with lora_A and lora_up",
        files.tensors("mixed_styles.safetensors", mixed_styles), "header", r"mixes lora_A/B and lora_down/up")
    two_copies = {**good, **{k.replace("blocks.0.attn.out_proj", "transformer_blocks.0.attn.to_out.0"): v
                             for k, v in good.items() if "out_proj" in k}}
    add("two_copies_of_a_target", "the same target given under native and diffusers names",
        files.tensors("two_copies.safetensors", two_copies), "header", r"given twice")
    slots = {**lora_keys("transformer_blocks.0.attn.to_out.0", *factors(24, 32, 4, seed=1), "ab", "default"),
             **lora_keys("transformer_blocks.0.attn.to_q", *factors(32, 24, 4, seed=2), "ab", "other")}
    add("two_peft_slots", "two PEFT adapter slots (.default. and .other.) in one file",
        files.tensors("two_slots.safetensors", slots), "header", r"several PEFT adapter slots")
    fp8 = {k: v.to(torch.float8_e4m3fn) for k, v in good.items()}
    add("fp8_factors", "LoRA factors stored as F8_E4M3", files.tensors("fp8.safetensors", fp8), "header",
        r"F8_E4M3.*not supported")
    int8 = {k: (v * 100).to(torch.int8) for k, v in good.items()}
    add("int8_factors", "LoRA factors stored as I8", files.tensors("int8.safetensors", int8), "header",
        r"I8.*not supported")

    # --- tensors that are not numbers ----------------------------------------------------------------------------
    nan = {**good, "blocks.0.mlp.fc1.lora_B.weight": torch.full((64, 4), float("nan"))}
    add("nan_weights", "lora_B of blocks.0.mlp.fc1 is all NaN", files.tensors("nan.safetensors", nan), "load",
        r"NaN/Inf")
    inf = dict(good)
    inf["blocks.0.attn.qkv_proj.lora_A.weight"] = good["blocks.0.attn.qkv_proj.lora_A.weight"].clone()
    inf["blocks.0.attn.qkv_proj.lora_A.weight"][0, 0] = float("inf")
    add("inf_weights", "one +Inf in lora_A of blocks.0.attn.qkv_proj", files.tensors("inf.safetensors", inf), "load",
        r"NaN/Inf")
    kohya = native_factors({"lora_unet_blocks_0_attn_out_proj": (24, 32)}, style="du")
    alpha_key = "lora_unet_blocks_0_attn_out_proj.alpha"
    add("stored_alpha_negative", "a kohya .alpha tensor of -8",
        files.tensors("alpha_negative.safetensors", {**kohya, alpha_key: torch.tensor(-8.0)}),
        "header", r"stores alpha -8")
    add("stored_alpha_nan", "a kohya .alpha tensor of NaN",
        files.tensors("alpha_nan.safetensors", {**kohya, alpha_key: torch.tensor(float("nan"))}),
        "header", r"stores alpha nan")
    add("stored_alpha_not_scalar", "a kohya .alpha tensor of shape [2]",
        files.tensors("alpha_vector.safetensors", {**kohya, alpha_key: torch.tensor([8.0, 8.0])}),
        "header", r"not a readable scalar alpha")

    # --- settings given by the user ------------------------------------------------------------------------------
    for kind, value, expect in (("user_alpha_zero", 0.0, r"alpha must be a finite number > 0"),
                                ("user_alpha_negative", -8.0, r"alpha must be a finite number > 0"),
                                ("user_alpha_nan", float("nan"), r"alpha must be a finite number > 0"),
                                ("user_alpha_inf", float("inf"), r"alpha must be a finite number > 0"),
                                ("user_alpha_string", "eight", r"alpha must be a number")):
        add(kind, f"explicit alpha {value!r}", good_path, "settings", expect, alpha=value,
            cli_expect=r"--alpha.*invalid float value: 'eight'" if isinstance(value, str) else None)
    for kind, value in (("scale_nan", float("nan")), ("scale_inf", float("inf")), ("scale_1e9", 1e9)):
        add(kind, f"scale (strength) {value!r}", good_path, "settings",
            r"scale must be finite and between -100 and 100", strength=value)
    add("scale_string", "scale 'strong'", good_path, "settings", r"scale must be a number", strength="strong",
        cli_expect=r"--scale.*invalid float value: 'strong'")

    # --- adapter_config.json beside the file ---------------------------------------------------------------------
    def peft_folder(name: str, config: str) -> str:
        def build(folder: Path) -> None:
            _save(folder / "adapter_model.safetensors",
                  native_factors({"base_model.model.transformer_blocks.0.attn.to_out.0": (24, 32)}))
            (folder / "adapter_config.json").write_text(config)

        return files.call(name, build)

    add("adapter_config_malformed", "adapter_config.json is not JSON",
        peft_folder("config_malformed", '{"r": 4, "lora_alpha": 8,'), "header",
        r"adapter_config\.json is not valid JSON")
    add("adapter_config_not_object", "adapter_config.json holds a JSON list",
        peft_folder("config_list", "[4, 8]"), "header", r"must hold a JSON object")
    add("adapter_config_loha", "adapter_config.json says peft_type LOHA for a file of LoRA factors",
        peft_folder("config_loha", '{"peft_type": "LOHA", "r": 4, "alpha": 8}'), "header", r"LOHA adapter, not LoRA")
    add("adapter_config_dora", "adapter_config.json sets use_dora for a file without magnitude vectors",
        peft_folder("config_dora", '{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_dora": true}'), "header",
        r"use_dora")
    add("adapter_config_negative_alpha", "adapter_config.json gives lora_alpha -8",
        peft_folder("config_negative_alpha", '{"peft_type": "LORA", "r": 4, "lora_alpha": -8}'), "header",
        r"lora_alpha.*-8")
    add("metadata_negative_alpha", "the file's __metadata__ gives lora_alpha '-8'",
        files.tensors("metadata_negative_alpha.safetensors", native_factors({"blocks.0.attn.out_proj": (24, 32)}),
                      {"lora_alpha": "-8"}), "header", r"lora_alpha.*-8")
    add("adapter_config_pattern_not_regex", "adapter_config.json alpha_pattern has a key that is not a regex",
        peft_folder("config_bad_pattern",
                    '{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "alpha_pattern": {"to_out.(": 4}}'),
        "header", r"alpha_pattern.*to_out\.\(")

    # --- where the file is: weight names, repo ids, folders ------------------------------------------------------
    def two_weights(folder: Path) -> None:
        _save(folder / "a.safetensors", good)
        _save(folder / "b.safetensors", good_tensors(seed=5))

    several = files.call("several_weights", two_weights)
    add("several_weights_no_name", "a folder with two .safetensors files and no weight name", several, "source",
        r"2 \.safetensors files.*--weight-name")
    add("weight_name_not_in_folder", "a weight name the folder does not have", several, "source",
        r"c\.safetensors is not in", weight_name="c.safetensors")
    add("weight_name_dotdot", "weight name ../good_for_settings.safetensors (escapes the folder)", several,
        "source", r"contains '\.\.'", weight_name="../good_for_settings.safetensors")
    add("weight_name_dotdot_inner", "weight name sub/../../good_for_settings.safetensors", several, "source",
        r"contains '\.\.'", weight_name="sub/../../good_for_settings.safetensors")
    add("weight_name_absolute", "weight name /etc/passwd", several, "source", r"absolute path",
        weight_name="/etc/passwd")
    add("weight_name_absolute_windows", r"weight name C:\adapter.safetensors", several, "source",
        r"backslash|absolute", weight_name="C:\\adapter.safetensors")
    add("weight_name_pickle", "weight name adapter.bin", several, "source", r"pickle", weight_name="adapter.bin")
    add("weight_name_on_hub_dotdot", "a Hub repo id with weight name ../../x.safetensors", NONEXISTENT_REPO, "source",
        r"contains '\.\.'", weight_name="../../x.safetensors")
    pickles_only = files.call("pickles_only", lambda folder: torch_pickle(folder / "pytorch_lora_weights.bin"))
    add("folder_with_only_pickles", "a folder holding only a .bin", pickles_only, "source",
        r"no \.safetensors file")
    add("repo_id_three_parts", "repo id a/b/c (neither a repo nor a local path)", "h3app-owner/name/extra", "source",
        r"does not exist|(not|nor) a Hub repo id")
    add("repo_id_no_owner", "repo id without an owner", "just-a-name", "source", r"not a Hub repo id")
    add("repo_id_double_dash", "repo id with '--'", "owner/bad--name", "source", r"not a valid Hub repo id")
    add("repo_id_space", "repo id with a space", "owner/bad name", "source", r"not a valid Hub repo id")
    add("source_empty", "an empty SOURCE", "   ", "source", r"SOURCE is empty")

    add("url_other_host", "a URL that is not the Hub", "https://example.com/lora.safetensors", "source",
        r"not a Hugging Face URL")
    add("url_file_scheme", "a file:// URL", "file:///etc/passwd", "source", r"only http\(s\) URLs")
    add("revision_dotdot", "revision with '..'", NONEXISTENT_REPO, "source", r"not a valid branch",
        revision="main/../../x")
    add("local_file_missing", "a local path that does not exist",
        files.call("missing.safetensors", lambda path: None), "source", r"does not exist")
    add("repo_missing_offline", "a Hub repo that does not exist, with HF_HUB_OFFLINE=1", NONEXISTENT_REPO, "source",
        r"not in the local cache and HF_HUB_OFFLINE=1")

    # --- hosted mode only ----------------------------------------------------------------------------------------
    add("hosted_path_outside_allow_list", "a valid local adapter outside the server's allowed folders", good_path,
        "hosted", r"not allowed on this server")
    add("hosted_system_file", "/etc/passwd as SOURCE", "/etc/passwd", "hosted", r"not allowed on this server")
    add("hosted_source_nul_byte", "a SOURCE with a NUL byte (pasted into the UI or sent through the API)",
        "owner/na\x00me", "hosted", r"control character|NUL|not a (valid )?Hub repo id")
    return entries


def make_accepted(folder: str | Path) -> list[Accepted]:
    """Inputs that look wrong but are valid: each must be applied, with a warning."""
    root = Path(folder).resolve()
    kohya = native_factors({"lora_unet_blocks_0_attn_out_proj": (24, 32), "lora_unet_blocks_0_mlp_fc2": (24, 32)},
                           style="du")
    alphas = {"lora_unet_blocks_0_attn_out_proj.alpha": torch.tensor(0.0),
              "lora_unet_blocks_0_mlp_fc2.alpha": torch.tensor(0.0)}
    zero = root / "accepted" / "stored_alpha_zero.safetensors"
    _save(zero, {**kohya, **alphas})
    folder_r = root / "accepted" / "config_rank_mismatch"
    _save(folder_r / "adapter_model.safetensors",
          native_factors({"base_model.model.transformer_blocks.0.attn.to_out.0": (24, 32)}))
    (folder_r / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 16, "lora_alpha": 8}')
    return [
        Accepted("stored_alpha_zero", "kohya .alpha tensors of 0 (kohya: alpha = rank)", str(zero),
                 r"alpha 0.*alpha = rank"),
        Accepted("adapter_config_rank_mismatch", "adapter_config.json says r=16, the tensors have rank 4",
                 str(folder_r), r"r=16.*rank 4"),
    ]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/bad_inputs.py OUT_DIR", file=sys.stderr)
        return 2
    entries = make_corpus(argv[0])
    accepted = make_accepted(argv[0])
    for entry in entries:
        extra = "".join(f" {k}={getattr(entry, k)!r}" for k in ("weight_name", "revision", "alpha")
                        if getattr(entry, k) is not None)
        if entry.strength != 1.0:
            extra += f" strength={entry.strength!r}"
        print(f"{entry.kind:32} {entry.stage:8} {entry.what}{extra}")
    for item in accepted:
        print(f"{item.kind:32} {'accepted':8} {item.what}")
    print(f"{len(entries)} bad inputs, {len(accepted)} accepted, in {Path(argv[0]).resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
