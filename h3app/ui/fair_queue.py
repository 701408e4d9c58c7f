"""Where the UI's GPU events took their admission from before the hosting room (``h3app/hosting/``): kept only so
that ``adapter_panel.py`` and ``api.py`` (issue 40's files) import unchanged; import ``h3app.hosting.gpu_gate``."""

from ..hosting.gpu_gate import admitted, gpu_events

__all__ = ["admitted", "gpu_events"]
