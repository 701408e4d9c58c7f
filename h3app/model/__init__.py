"""Loading MiniMax H3 (diffusers): the real repo or the embedded tiny checkpoint, through one code path."""
