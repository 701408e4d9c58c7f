"""H3 LoRA Lab: inspect, apply and compare LoRA adapters on the MiniMax H3 video+audio DiT."""

__version__ = "0.1.0"
