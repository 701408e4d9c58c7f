"""The docs quote the duration range the code accepts: ``RELEASED.describe()``, not the pipeline's 5–15 s
(the frame rule makes 14.375 s the longest clip)."""
from pathlib import Path

from h3app.rules.frames import RELEASED

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_doc_that_states_the_duration_range_states_the_rules_own():
    said = {path.name: path.read_text() for path in DOCS.glob("*.md")}
    assert RELEASED.describe() in said["backend.md"] and RELEASED.describe() in said["security.md"]
    top = f"{RELEASED.longest_seconds:g}"
    assert top != "15"  # the frame rule's longest clip, below the pipeline's max_seconds
    stale = [name for name, text in said.items() if "duration 5–15 s" in text or "| 5–15 s at" in text]
    assert stale == []
