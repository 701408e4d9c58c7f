"""A LoRA *file*: find it, read its header, detect its format, resolve its alpha, normalise its keys."""
