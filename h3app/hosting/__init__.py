"""The hosting room: who may use a public server's GPU, disk and threads, and why a request was refused.

- ``limits.py``: the one table of limits (queue depths, per-visitor shares, upload and cache quotas; env overrides).
- ``refusals.py``: the one place that words a refusal (``why_refused``): every "no" a visitor gets, one line.
- ``visitors.py``: who a visitor is (session and client address).
- ``admission.py``: counts held jobs per visitor and in total (GPU jobs, off-queue requests); the worker's owner.
- ``gpu_gate.py``: a GPU event held in the admission; the Gradio concurrency of GPU events and the queue's size.
- ``join_bound.py``: the per-visitor bound on cheap events joining Gradio's queue.
- ``upload_policy.py`` / ``upload_quota.py``: which uploads are taken, and the disk they may use.

Nothing here imports the UI; the hooks into Gradio's queue that need its private parts are in
``h3app/ui/gradio_compat.py``. Importing ``limits``, ``refusals`` or ``admission`` loads no Gradio (the backend
uses them).
"""
