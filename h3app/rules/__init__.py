"""Rules that several layers share, each written once: the H3 module vocabulary, the LoRA scale formula, the
parsers of user-given values and the fixed choices. Nothing here imports torch, so the CLI's light commands,
the adapter inspector and the UI can use it without loading a model."""
