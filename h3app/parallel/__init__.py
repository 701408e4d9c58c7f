"""Context parallel over several ranks (GPUs, machines, or CPU processes in CI).

One concept per module: ``topology`` (the ``--ulysses``/``--ring`` flags), ``launch`` (starting or joining the
ranks), ``timeouts`` (bounded collectives and their one-line errors), ``context_parallel`` (sharding an H3
transformer), ``group`` (the ranks' job channel and agreements), ``lockstep`` (the job wrapper that runs one backend
job on every rank, injected into the backend by the entry points) and ``follower`` (what ranks other than 0 do).
What needs diffusers' or torch's private API goes through ``h3app.model.diffusers_compat`` / ``torch_compat``.
docs/multi-gpu.md tells the design.
"""
