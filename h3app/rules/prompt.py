"""How long a prompt may be: a cap in the model's own tokens, and a cheap character bound checked before tokenising.

At most 1,024 tokens (H3 prompts are a few hundred; every token is a row of the full-attention sequence); before
the tokenizer runs, at most 16 characters per allowed token (no tokenizer token is longer), so a 100 kB prompt is
refused without being read.
"""

from __future__ import annotations

MAX_PROMPT_TOKENS = 1024
CHARS_PER_TOKEN = 16  # no tokenizer token is longer: the cheap pre-check before tokenising
MAX_PROMPT_CHARS = MAX_PROMPT_TOKENS * CHARS_PER_TOKEN
