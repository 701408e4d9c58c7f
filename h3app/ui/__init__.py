"""Gradio Blocks and event functions only: no model logic lives here."""
