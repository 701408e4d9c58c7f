"""Inspection's fast paths give the answers of their plain definitions (docs/adapters.md, "What a first look costs").

- the key parse (a prefix regex, then a *search* for the factor suffix) equals one lazy regex over the whole key;
- the column-wise header check accepts exactly what the one-by-one check accepts, with the same entries, and leaves
  every problem to the one-by-one check to name;
- the factor checks name the first failing module, also among modules of the same shapes.
"""

from __future__ import annotations

import json
import re

import pytest
from adapter_fixtures import lightx2v_full_size_entries

from h3app.adapters.formats import FLATTENED_PREFIXES, WRAPPER_PREFIXES, match_module, plan_adapter
from h3app.adapters.header import _check_entries_one_by_one, _check_entries_together, parse_header
from h3app.adapters.types import HeaderView
from h3app.errors import H3AppError

# The plain definition of a key: atomic prefix, the shortest stem, the factor suffix, end of key.
PLAIN_KEY = re.compile(
    "^(?P<prefix>(?>(?:" + "|".join(map(re.escape, WRAPPER_PREFIXES)) + "){0,4}"
    "(?:" + "|".join(map(re.escape, FLATTENED_PREFIXES)) + ")?))"
    r"(?P<stem>.+?)\.(?:(?P<ab>lora_[AB])(?:\.(?P<slot>(?!(?:weight|bias)$)[A-Za-z0-9_\-]+))?(?:\.weight)?"
    r"|(?P<du>lora_(?:down|up))(?:\.weight)?|(?P<alpha>alpha))$"
)

TRICKY_KEYS = (
    "transformer_blocks.0.attn.to_q.lora_A.weight", "transformer.lora_A.weight", "transformer.x.lora_A",
    "base_model.model.transformer.transformer_blocks.1.ff.net.2.lora_B.default.weight", "a.lora_A.lora_A.weight",
    "x.lora_B.lora_A", "blocks.0.attn.qkv_proj.lora_A\n", "bl\nocks.0.lora_A.weight", "\n.lora_A", ".lora_A",
    "..lora_A", "lora_unet_blocks_0_mlp_fc1.lora_down.weight", "lora_unet_.alpha", "model.model.model.model.model.a.alpha",
    "transformer_ref.transformer_blocks.0.attn.to_k.lora_B", "x.lora_A.weight.weight", "x.lora_B.bias", "x.alpha.alpha",
    "x.lora_A.default0", "x.lora_A.weight\n", "transformer_blocks.0.attn.to_q.lora_A.default.weight.lora_B.x",
    "transformer.transformer_blocks.0.attn.to_q.lora_A.weight", "model.diffusion_model.blocks.0.attn.out_proj.lora_A",
    "transformer_blocks.0.attn.to_q.lora_A.weight\n", "lora_unet_transformer_blocks_0_ff_net_2.lora_up.weight",
    "diffusion_model.blocks.1.mlp.fc2.lora_B.default", "transformer.transformer_blocks.0.attn.\nto_q.lora_A.weight",
)


SWAP = {"lora_A": "lora_B", "lora_B": "lora_A", "lora_down": "lora_up", "lora_up": "lora_down"}


def planned_key(key: str) -> tuple[str, str] | None:
    """(stored stem, prefix) of the module that a file with ``key``, its partner factor and one other module puts
    ``key`` in; None when ``key`` is unmatched (or the file refused)."""
    tensors = {"transformer_blocks.9.attn.to_k.lora_A.weight": ("F32", (2, 4)),
               "transformer_blocks.9.attn.to_k.lora_B.weight": ("F32", (4, 2))}
    plain = PLAIN_KEY.match(key)
    factor = plain and (plain.group("ab") or plain.group("du"))
    down = factor in ("lora_A", "lora_down")
    tensors[key] = ("F32", (2, 4) if down else (6, 2))
    if factor:  # the other factor, spelt the same way
        group = "ab" if plain.group("ab") else "du"
        tensors[key[: plain.start(group)] + SWAP[factor] + key[plain.end(group):]] = ("F32", (6, 2) if down else (2, 4))
    view = HeaderView(tensors=tensors, metadata={}, scalars={}, adapter_config=None, file_bytes=0, name="k.safetensors")
    try:
        plan = plan_adapter(view)
    except H3AppError:
        return None
    for module in plan.modules + plan.reference_modules:
        if key in module.keys:
            return module.stem, module.prefix
    return None


@pytest.mark.parametrize("key", TRICKY_KEYS)
def test_the_key_parse_finds_the_stem_the_lazy_regex_finds(key: str) -> None:
    plain = PLAIN_KEY.match(key)
    expected = None
    if plain is not None and plain.group("alpha") is None:
        flattened = plain.group("prefix").endswith(FLATTENED_PREFIXES)
        if match_module(plain.group("stem"), flattened) is not None:
            expected = (key[: plain.end("stem")], plain.group("prefix"))
    assert planned_key(key) == expected


def test_a_parsed_key_of_an_h3_module_is_planned_and_an_unparsed_one_never() -> None:
    assert planned_key("transformer.transformer_blocks.0.attn.to_q.lora_A.weight") == (
        "transformer.transformer_blocks.0.attn.to_q", "transformer.")
    assert planned_key("transformer_blocks.0.attn.to_q.lora_A.weight\n") == (
        "transformer_blocks.0.attn.to_q", "")  # "$" before a final line break, as the regex has it
    assert planned_key("transformer_blocks.0.attn.\nto_q.lora_A.weight") is None  # a stem never spans a line break
    assert PLAIN_KEY.match("transformer_blocks.0.attn.\nto_q.lora_A.weight") is None


def _header(entries: dict) -> dict:
    return json.loads(json.dumps(entries))


def test_the_column_check_accepts_a_real_header_with_the_one_by_one_entries() -> None:
    offset, header = 0, {}
    for key, (dtype, shape) in lightx2v_full_size_entries(rank=2).items():
        size = shape[0] * shape[1] * 2
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["x.alpha"] = {"dtype": "F32", "shape": [], "data_offsets": [offset, offset + 4]}
    together = _check_entries_together(_header(header))
    assert together is not None and together == _check_entries_one_by_one(_header(header), "f")
    assert list(together[0]) == list(header) and together[1] == offset + 4


BAD_ENTRIES = {
    "not an object": [1, 2],
    "missing field": {"dtype": "F32", "shape": [1]},
    "unknown dtype": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]},
    "dtype not text": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]},
    "boolean dim": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]},
    "negative dim": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]},
    "float dim": {"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]},
    "three offsets": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]},
    "reversed offsets": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]},
    "wrong size": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]},
    "a hole": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
    "sub-byte": {"dtype": "F4", "shape": [3], "data_offsets": [0, 1]},
}


@pytest.mark.parametrize("problem", sorted(BAD_ENTRIES))
def test_the_column_check_leaves_every_problem_to_the_one_by_one_check(problem: str) -> None:
    header = {"a.lora_A.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
              "b.lora_A.weight": BAD_ENTRIES[problem]}
    if problem == "a hole":
        header["b.lora_A.weight"], header["a.lora_A.weight"]["data_offsets"] = BAD_ENTRIES[problem], [8, 12]
    assert _check_entries_together(_header(header)) is None
    with pytest.raises(H3AppError):
        _check_entries_one_by_one(_header(header), "f")
    with pytest.raises(H3AppError, match="f"):
        parse_header(json.dumps(header).encode(), "f")


def test_factor_checks_name_the_first_failing_module_among_modules_of_the_same_shapes() -> None:
    entries = {k: v for k, v in lightx2v_full_size_entries(rank=2).items() if ".transformer_blocks." not in k}
    entries["transformer_blocks.3.attn.to_q.lora_B.default.weight"] = ("I8", (5376, 2))  # the shapes of its neighbours
    entries["transformer_blocks.3.attn.to_q.lora_A.default.weight"] = ("BF16", (2, 5376))
    entries["transformer_blocks.7.attn.to_q.lora_B.default.weight"] = ("I8", (5376, 2))
    entries["transformer_blocks.7.attn.to_q.lora_A.default.weight"] = ("BF16", (2, 5376))
    view = HeaderView(tensors=entries, metadata={}, scalars={}, adapter_config=None, file_bytes=0, name="c.safetensors")
    with pytest.raises(H3AppError, match=r"transformer_blocks\.3\.attn\.to_q\.lora_B\.default\.weight' is I8"):
        plan_adapter(view)
