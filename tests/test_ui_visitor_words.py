"""What a page visitor reads has no developer wording: no ``--flag``, environment variable, ``python -m``, module
path or internal term outside the snippet boxes, and counts with their nouns in the right number (docs/ui.md,
"Visitor wording"). Scanned without a browser: every visible control's label, help, placeholder and text of the
built app (local and hosted), every card Inspect draws for each demo adapter, the notes under the request, and the
backend's refusals as the page words them (``ui/presenters/visitor_words.py``)."""

from __future__ import annotations

import html
import re

import gradio as gr
import pytest

from h3app.errors import H3AppError
from h3app.request import GenerationRequest
from h3app.ui.presenters.visitor_words import counted, visitor_text

# What a visitor must not read: a flag, an environment variable, a command, a module or file path, internal terms.
DEVELOPER = re.compile(r"(?<![\w-])--[a-z]|\b[A-Z][A-Z0-9]*_[A-Z0-9_]{2,}\b|python -m|\bh3app\.[a-z]|\b\w+/\w+\.py\b|"
                       r"\bdocs/|num_inference_steps|sigma points|terminal one|residual|\b1 (cells|seeds|alphas|"
                       r"scales|generations)\b")


def visible_text(markup: str) -> str:
    """The text of ``markup`` as a reader sees it (tags removed, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", " ", str(markup)))


def developer_words(texts: dict[str, str]) -> dict[str, str]:
    found = {}
    for where, text in texts.items():
        hit = DEVELOPER.search(visible_text(text))
        if hit:
            found[where] = visible_text(text)[max(0, hit.start() - 40):hit.end() + 40]
    return found


def _shown(block) -> bool:
    """The block and every container above it are visible (the hidden API inputs are not read by anyone)."""
    while block is not None:
        if getattr(block, "visible", True) is False:
            return False
        block = getattr(block, "parent", None)
    return True


def page_texts(demo) -> dict[str, str]:
    """Each visible control's words, snippet boxes (``gr.Code``) left out."""
    texts = {}
    for block in demo.blocks.values():
        if isinstance(block, gr.Code) or not _shown(block):
            continue
        name = getattr(block, "elem_id", None) or f"{type(block).__name__}#{block._id}"
        for attr in ("label", "info", "placeholder", "value"):
            value = getattr(block, attr, None)
            if isinstance(value, str) and value.strip():
                texts[f"{name}.{attr}"] = value
        for choice in getattr(block, "choices", None) or ():
            texts[f"{name}.choice"] = str(choice[0] if isinstance(choice, (list, tuple)) else choice)
    return texts


@pytest.fixture(scope="module", params=["local", "hosted"])
def app_texts(request, backend):
    from h3app.ui.app_ui import build_app

    hosted = request.param == "hosted"
    was = backend.hosted
    backend.hosted = hosted
    try:
        return page_texts(build_app(backend))
    finally:
        backend.hosted = was


def test_the_pages_visible_text_has_no_developer_wording(app_texts):
    assert len(app_texts) > 100  # the scan read the page
    assert developer_words(app_texts) == {}


def test_every_demo_adapters_cards_have_no_developer_wording(backend):
    from h3app.ui.adapter.events import AdapterEvents
    from h3app.ui.forms import SlotForm

    events = AdapterEvents(backend)
    texts = {}
    for label, path in events.demo_choices():
        pick = events.pick_demo(path)
        view = events.inspect_view(SlotForm(source=pick.source, weight=pick.weight["value"]))
        for field in ("inspect_html", "alpha_html", "readout", "known_html"):
            texts[f"{label}.{field}"] = getattr(view, field)
    assert len(texts) == 4 * len(events.demo_choices()) >= 36
    assert developer_words(texts) == {}


def _refusal(**fields) -> str:
    try:
        GenerationRequest(prompt="a red ball", **fields)
    except H3AppError as error:
        return str(error)
    raise AssertionError(f"not refused: {fields}")


def test_the_backends_refusals_reach_the_page_in_a_visitors_words():
    """The CLI's fix is a flag or a server setting; the page says the control, or what it means for the visitor."""
    messages = {
        "keyframes": _refusal(workflow="fl2va"),
        "references": _refusal(workflow="ref2va"),
        "one side": _refusal(height=32),
        "offline search": "searching the Hub needs the network, and HF_HUB_OFFLINE=1 is set: unset HF_HUB_OFFLINE "
                          "to search, or inspect a repo id you know (its files are read from the cache).",
        "offline file": "owner/x/a.safetensors is not in the local cache and HF_HUB_OFFLINE=1: unset HF_HUB_OFFLINE "
                        "to download it, or fetch it once while online.",
        "gated": "Hub repo a/b is gated and no token was given for a/b: accept its terms at URL, then set HF_TOKEN or "
                 "paste a token.",
        "no page control": "12 AdaLN parts cannot bind; add --skip-parts adaln to apply the other 40 parts.",
        "unmerged": "a per-modality strength (video ×0.5) needs --lora-mode unmerged.",
    }
    assert developer_words(messages) != {}  # the scan can fail: the CLI's wording is developer wording
    shown = {name: visitor_text(text) for name, text in messages.items()}
    assert developer_words(shown) == {}
    assert "a First and/or Last keyframe" in shown["keyframes"] and "Height and Width" in shown["one side"]
    assert "this server is offline" in shown["offline search"] and "pick a demo adapter" in shown["offline file"]
    assert "LoRA mode unmerged" in shown["unmerged"]
    assert "the command line's skip parts option" in shown["no page control"]
    assert visitor_text(shown["keyframes"]) == shown["keyframes"]  # words already the page's stay as they are


def test_counts_read_in_the_right_number():
    assert [counted(n, "cell") for n in (0, 1, 2)] == ["0 cells", "1 cell", "2 cells"]
    assert counted(1, "seed") == "1 seed" and counted(3, "entry", "entries") == "3 entries"


def test_the_grids_estimate_and_status_count_in_the_right_number(backend):
    from h3app.ui.compare.events import ComparisonEvents
    from h3app.ui.forms import GridForm
    from h3app.ui.session import RunningJobs

    comparisons = ComparisonEvents(backend, RunningJobs())
    one = comparisons.estimate(GridForm("1", "1", "7"))
    assert "**1 cell**" in one and "1 alpha × 1 scale × 1 seed" in one and "1 no-LoRA baseline = 2 generations" in one
    assert developer_words({"estimate": one}) == {}
    same = type("Cell", (), {"baseline_psnr": float("inf")})()  # a cell identical to no LoRA
    assert ComparisonEvents._grid_status([same], done=True).startswith("Done: 1 cell. ⚠ **1 cell is identical")
