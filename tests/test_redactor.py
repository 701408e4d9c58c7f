"""The hosted answer redactor: server folders in text become words a visitor knows, while a file Gradio serves itself
(the comparison view's videos, as FileData) keeps its server path, which Gradio needs to find and cache it."""

from __future__ import annotations

from types import SimpleNamespace

from h3app.ui.compare.view import file_data
from h3app.ui.serving.endpoint_guard import Redactor


def test_text_is_redacted_and_served_files_keep_their_path(tmp_path):
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    video = str(outputs / "abc.mp4")
    backend = SimpleNamespace(policy=SimpleNamespace(allowed_local_dirs=()), uploads_dir=None, output_dir=outputs)
    answer = Redactor(backend).value({"note": f"wrote {video}", "columns": [{"video": file_data(video)}],
                                      "out": video})
    assert answer["note"] == "wrote results/abc.mp4"
    assert answer["out"] == "abc.mp4"  # a result path: by its file name
    assert answer["columns"][0]["video"] == file_data(video)  # untouched: Gradio moves it to its cache
