"""Bounded work per request, cancels that stop at the next step, one generic line for the unexpected, no server
paths in hosted answers (issue 17); the cheaper equivalence check (issue 18)."""

import logging
import re
from pathlib import Path

import pytest
from polling import wait_until

from h3app.backend import media
from h3app.backend.generation import Cancelled, count_evaluations
from h3app.backend.outputs import names_only
from h3app.backend.service import Backend
from h3app.errors import H3AppError, InternalError
from h3app.request import GenerationRequest
from h3app.rules.prompt import MAX_PROMPT_CHARS
from h3app.settings import LoRASettings

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = ROOT / "assets" / "adapters"
TURBO = str(ADAPTERS / "lightx2v_turbo_no_alpha.safetensors")
REQUEST = GenerationRequest(prompt="a paper lantern on a river", seed=4, steps=3)


@pytest.fixture()
def local(tiny_model, tmp_path):
    service = Backend(loaded=tiny_model, output_dir=tmp_path / "out")
    yield service
    service.binder.reset()
    service.close()


@pytest.fixture()
def hosted(tiny_model, tmp_path):
    service = Backend(loaded=tiny_model, output_dir=tmp_path / "hosted-out", hosted=True,
                      allowed_local_dirs=(ADAPTERS,))
    yield service
    service.binder.reset()
    service.close()


def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text and "Traceback" not in text and len(text) < 400
    return text


def evaluations(request: GenerationRequest) -> int:
    return count_evaluations(request.steps, 12.0)


@pytest.mark.parametrize("size", [1024, 10**9, 1e300])
def test_a_canvas_over_the_models_refused_before_queueing(local, size):
    with pytest.raises(H3AppError) as error:
        local.submit_generate(GenerationRequest(prompt="x", height=size, width=size, steps=2))
    assert "pixels" in one_line(error) and f"{local.limits.max_pixels:,}" in str(error.value)
    assert local.worker.current is None and local.limits.max_pixels == 6144  # the tiny checkpoint's own canvas


def test_prompt_steps_grid_and_text_fields_are_capped(local, hosted):
    with pytest.raises(H3AppError) as long_prompt:
        GenerationRequest(prompt="x" * (MAX_PROMPT_CHARS + 1))
    assert "1,024 tokens" in one_line(long_prompt)
    with pytest.raises(H3AppError) as many_tokens:
        local.submit_generate(GenerationRequest(prompt="rain " * 1500, steps=2))
    assert re.search(r"has [\d,]+ tokens, more than the 1,024", one_line(many_tokens))
    with pytest.raises(H3AppError) as steps:
        hosted.submit_generate(GenerationRequest(prompt="x", steps=150))
    assert "between 2 and 100" in one_line(steps)
    local.check_request(GenerationRequest(prompt="x", steps=150))  # a local server allows 200
    with pytest.raises(H3AppError) as grid:
        hosted.plan_grid([1, 2, 4, 8, 16], [0.5, 1.0, 1.5, 2.0], [0])
    assert "20 cells, more than 16" in one_line(grid)
    with pytest.raises(H3AppError) as source:
        LoRASettings(source="a/" + "b" * 5000)
    assert "4,096 allowed" in one_line(source)


def test_cancel_stops_a_check_at_its_next_step_and_counts_the_whole_check(local, tiny_model):
    handle = local.submit_equivalence(REQUEST, LoRASettings(source=TURBO))
    wait_until(lambda: handle.progress.done >= 1 or handle.done, "the check's first step", wait=handle.wait_for_change)
    handle.cancel()
    with pytest.raises(Cancelled) as error:
        handle.result(timeout=600)
    done, total = map(int, re.search(r"cancelled after (\d+) of (\d+) steps", str(error.value)).groups())
    assert total == 3 * evaluations(REQUEST) + 1 and done < total
    assert not local.binder.engine().active()


def test_cancel_stops_a_grid_and_counts_the_whole_grid(local):
    plan = local.plan_grid([8.0, 16.0], [1.0], [0])
    handles = []

    def cancel_at_first_step(done: int, total: int) -> None:
        if done >= 1 and handles:
            handles[0].cancel()

    with pytest.raises(Cancelled) as error:
        list(local.grid(REQUEST, LoRASettings(source=TURBO), plan, on_step=cancel_at_first_step,
                        on_handle=handles.append))
    done, total = map(int, re.search(r"cancelled after (\d+) of (\d+) steps", str(error.value)).groups())
    assert total == evaluations(REQUEST) * (plan.cells + 1) and done < total


def test_a_job_whose_client_went_away_is_cancelled(local):
    handle = local.submit_generate(GenerationRequest(prompt="a long walk", seed=1, steps=8))
    with pytest.raises(Cancelled, match=r"client went away\) after \d+ of 7 steps"):
        local.run(handle, abandoned=lambda: handle.progress.done >= 1)


def test_an_unexpected_error_reaches_a_visitor_as_one_generic_line(hosted, caplog):
    secret = "/srv/h3app/private/" + "x" * 1_000_000

    def broken(ctx):
        raise ValueError(secret)

    with caplog.at_level(logging.ERROR, logger="h3app"), pytest.raises(InternalError) as error:
        hosted.run(hosted.worker.submit(broken, label="broken"))
    text = one_line(error)
    assert "/srv" not in text and "ValueError" not in text and re.search(r"error [0-9a-f]{8}", text)
    logged = [r.getMessage() for r in caplog.records if r.name == "h3app"]
    assert logged and "ValueError" in logged[-1] and "/srv/h3app/private/" in logged[-1]
    assert len(logged[-1]) < 20_000  # the megabyte of input is not echoed into the log


def test_hosted_answers_name_files_but_no_server_folders(hosted, tmp_path):
    output = hosted.generate(GenerationRequest(prompt="x", steps=2), [LoRASettings(source=TURBO)])
    answer = names_only(output.to_json())  # the one rule the UI applies to every hosted answer (endpoint_guard)
    assert "/" not in answer["out"] and "/" not in answer["thumbnail"]
    assert answer["adapters"][0]["source"] == Path(TURBO).name
    assert output.settings["adapters"][0]["source"] == Path(TURBO).name  # as the mp4 records it
    stored = media.read_settings(output.video_path)
    assert str(ADAPTERS) not in str(stored) and str(hosted.output_dir) not in str(stored)
    assert Path(output.video_path).is_file()  # the UI still serves the file itself


def test_the_check_runs_three_generations_and_one_control_step(local, tiny_model):
    transformer = tiny_model.transformer()
    forwards = []
    hook = transformer.register_forward_pre_hook(lambda *args: forwards.append(1))
    hits = tiny_model.decode_cache.hits
    try:
        result = local.check_equivalence(REQUEST, LoRASettings(source=TURBO))
    finally:
        hook.remove()
    assert result.identical and result.control_identical
    assert len(forwards) == 3 * evaluations(REQUEST) + 1  # A, B, fallback + A's first step again
    assert tiny_model.decode_cache.hits - hits == 2  # B's video and audio decodes came from A's
    cost = local.check_cost(REQUEST)
    assert (cost.full_runs, cost.control_steps) == (3, 1)
    assert cost.estimated_seconds == pytest.approx(local.last_seconds_per_run * (3 + 1 / evaluations(REQUEST)))


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_runs_ended_on_purpose_log_no_tracebacks_but_real_failures_still_do(local, tiny_model):
    """diffusers logs every exception leaving a pipeline block with its traceback; a cancel and the check's control
    step end a run on purpose and must not fill the server log with "Error in block" tracebacks."""
    from h3app.backend.generation import first_step_digest

    records = _Records()
    block_runner = logging.getLogger("diffusers.modular_pipelines.modular_pipeline")
    block_runner.addHandler(records)
    try:
        first_step_digest(tiny_model.pipeline("t2va"), REQUEST)
        handle = local.submit_generate(GenerationRequest(prompt="a long walk", seed=1, steps=8))
        with pytest.raises(Cancelled):
            local.run(handle, abandoned=lambda: handle.progress.done >= 1)
        assert not [m for m in records.messages if "Error in block" in m]

        def broken(module, args, kwargs, output):
            raise RuntimeError("a real failure inside the transformer")

        hook = tiny_model.transformer().register_forward_hook(broken, with_kwargs=True)
        try:
            with pytest.raises(Exception, match="a real failure"):
                first_step_digest(tiny_model.pipeline("t2va"), REQUEST)
        finally:
            hook.remove()
        assert [m for m in records.messages if "Error in block" in m and "a real failure" in m]
    finally:
        block_runner.removeHandler(records)
