"""Training recipe for the embedded tiny H3: a procedural ball-and-floor data set, the video decoder, the
transformer, a style LoRA and a 4-step Turbo LoRA (``python -m h3app.model.tiny train``; see docs/demo.md)."""
