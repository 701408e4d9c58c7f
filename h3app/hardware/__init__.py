"""Real hardware without a GPU: the full-size rehearsal on fake CUDA, the memory plan built on it, the hardware
flavors it is judged against, and the one-line summary the UI shows. docs/hardware.md describes the whole."""
