"""Gradio Blocks and event functions only: no model logic lives here.

By feature, each tab's layout beside its events: ``adapter/`` (a slot: panel, events, advanced strength), ``hub/``
(the Hub search panel), ``generate/`` (the Generate tab: request controls, jobs, step previews, predicted time, load
settings), ``compare/`` (Equivalence, Grid, History and the comparison view). Shared: ``presenters/`` (values → HTML
and words, snippets), ``serving/`` (named endpoints, MCP tools, the endpoint guard, the start-up page). At the top:
``app_ui`` (the page), ``session`` (the one state), ``forms`` (event forms), ``job_wiring`` (the jobs' events),
``gradio_compat`` (the one door to Gradio's private API), ``unclamped`` (number boxes and sliders without a clamp),
``user_error`` (a refusal as Gradio's error modal).
"""
