"""Backend defects a review found (issue 16): each test failed before its fix."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import av
import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from h3app.backend import media
from h3app.backend.generation import Cancelled
from h3app.backend.service import Backend
from h3app.backend.worker import Worker
from h3app.cli import main as cli_main
from h3app.errors import H3AppError
from h3app.request import GenerationRequest
from h3app.settings import LoRASettings

ROOT = Path(__file__).resolve().parents[1]
TURBO = ROOT / "assets" / "adapters" / "lightx2v_turbo_no_alpha.safetensors"
REQUEST = GenerationRequest(prompt="a red kite over dunes", seed=2, steps=2)


@pytest.fixture()
def backend(tiny_model, tmp_path):
    service = Backend(loaded=tiny_model, output_dir=tmp_path / "outputs", baseline_bytes=1)
    yield service
    service.binder.reset()
    service.close()


def stronger_copy(source: Path, target: Path, factor: float = 2.0) -> None:
    """``source`` with every up factor (lora_B) multiplied by ``factor``: another version of the same adapter."""
    tensors = load_file(str(source))
    save_file({k: (v * factor if "lora_B" in k or "lora_up" in k else v) for k, v in tensors.items()}, str(target))


@pytest.mark.slow
def test_grid_baselines_stay_within_their_byte_budget(backend):
    plan = backend.plan_grid([8.0], [1.0], [1, 2])
    cells = list(backend.grid(REQUEST, LoRASettings(source=str(TURBO)), plan))
    assert len(cells) == 2
    assert len(backend.baselines) == 1  # a budget of one byte keeps only the newest (the running grid's)


@pytest.mark.slow
def test_a_rewritten_local_adapter_file_is_used_by_the_next_job(backend, tmp_path):
    path = tmp_path / "mine.safetensors"
    path.write_bytes(TURBO.read_bytes())
    settings = [LoRASettings(source=str(path), alpha=32.0)]
    before = backend.generate(REQUEST, settings).result.hash
    stronger_copy(TURBO, path)
    after = backend.generate(REQUEST, settings).result.hash  # the adapter is still attached from the first job
    backend.binder.reset()
    fresh = backend.generate(REQUEST, settings).result.hash
    assert after == fresh and after != before


def test_an_attached_hub_adapter_follows_its_branch(backend, tmp_path, fake_hub):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    (first / "a.safetensors").write_bytes(TURBO.read_bytes())
    stronger_copy(TURBO, second / "a.safetensors")
    old = fake_hub.add_repo("someone/moving", first)
    settings = LoRASettings(source="someone/moving", weight_name="a.safetensors")
    first_load = backend.load(settings).provenance
    assert first_load["commit"] == old
    new = fake_hub.add_revision("someone/moving", "main", second, commit="f" * 40)
    moved = backend.load(settings).provenance  # the first load's adapter is still attached
    assert moved["commit"] == new and moved["sha256"] != first_load["sha256"]


def test_a_cancelled_queued_job_leaves_the_adapters_alone():
    failures: list[BaseException] = []
    worker = Worker(on_failure=failures.append)
    release = threading.Event()
    try:
        running = worker.submit(lambda ctx: release.wait(30), label="first")
        queued = worker.submit(lambda ctx: "ran", label="second")
        queued.cancel()
        release.set()
        assert running.result(timeout=30) is True
        with pytest.raises(Cancelled, match="before it started"):
            queued.result(timeout=30)
        assert failures == []  # nothing ran, so nothing is reset (other sessions' adapters stay attached)
    finally:
        release.set()
        worker.close()


def test_a_failed_encode_leaves_no_partial_file(tmp_path):
    odd = np.zeros((3, 7, 7, 3), np.float32)  # yuv420p needs even sides: libx264 refuses to open
    with pytest.raises(av.error.FFmpegError):
        media.write_mp4(tmp_path / "x.mp4", odd, np.zeros((2, 800), np.float32), 16000)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("audio_thread", [True, False])
def test_a_failed_audio_encode_beside_the_video_is_raised_and_leaves_no_file(tmp_path, audio_thread):
    """The soundtrack is encoded in its own thread while the video encodes: its failure must still reach the
    caller, after the video encode, with nothing left on disk."""
    frames = np.zeros((3, 8, 8, 3), np.float32)
    three_channels = np.zeros((3, 800), np.float32)  # the stream is opened mono for anything but stereo
    with pytest.raises(ValueError, match="to equal `1` but got `3`"):  # PyAV's own refusal, from the audio thread
        media.write_mp4(tmp_path / "x.mp4", frames, three_channels, 16000, audio_thread=audio_thread)
    assert list(tmp_path.iterdir()) == []


def run_python(*args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_cublas_workspace_is_configured_before_cuda_can_start():
    environment = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    code = "import os, h3app.backend.service; print(os.environ.get('CUBLAS_WORKSPACE_CONFIG'))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=300)
    assert done.stdout.strip() == ":4096:8", done.stderr


@pytest.mark.parametrize("field, value", [("steps", "abc"), ("steps", 2.5), ("steps", True), ("seed", "x"),
                                          ("seed", 1.5), ("duration", "long"), ("shift", float("nan")),
                                          ("workflow", 3), ("references", [3])])
def test_generation_request_checks_the_type_of_each_field(field, value):
    with pytest.raises(H3AppError, match=field.rstrip("s") if field == "references" else field) as error:
        GenerationRequest(prompt="p", **{field: value})
    assert "\n" not in str(error.value)


def test_generation_request_normalises_numeric_strings():
    request = GenerationRequest(prompt="p", steps="4", seed="7", duration="6")
    assert (request.steps, request.seed, request.duration) == (4, 7, 6.0)


@pytest.mark.parametrize("argv, help_hint", [([], "`python -m h3app --help`"),
                                             (["generate"], "`python -m h3app generate --help`")])
def test_usage_errors_name_the_program_once(argv, help_hint, capsys):
    with pytest.raises(SystemExit) as stop:
        cli_main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and help_hint in err and "h3app h3app" not in err


def assert_one_line_refusal(done: subprocess.CompletedProcess, *words: str) -> None:
    err = done.stderr.strip()
    assert done.returncode == 2, err
    assert "Traceback" not in err and "\n" not in err and err.startswith("error: ")
    assert all(word in err for word in words), err


NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}
MISSING_GPU = [["app.py", "--device", "cuda"],
               ["-m", "h3app", "generate", "--device", "cuda", "--prompt", "x", "--out", "x.mp4"],
               ["-m", "h3app", "check", "--device", "cuda", "--adapter", str(TURBO)]]
UNCACHED = ["app.py", "--model", "MiniMaxAI/MiniMax-H3"]
LIBRARIES_AT_REFUSAL = ["-c", "import sys; from h3app.cli import main; "
                              "codes = [main(['generate', '--device', 'cuda', '--prompt', 'x', '--out', 'x.mp4']), "
                              "main(['generate', '--model', 'someone/not-cached', '--prompt', 'x', '--out', 'x.mp4'])]; "
                              "print('exit', codes, 'loaded:', sorted(m for m in ('torch', 'diffusers', 'transformers', "
                              "'gradio') if m in sys.modules))"]


@pytest.fixture(scope="module")
def start_ups(tmp_path_factory) -> dict[str, subprocess.Popen]:
    """The start-ups below, launched side by side when the first of their tests runs (each pays the imports: on
    two cores two at a time is twice as fast); each test waits for its own with :func:`finished`."""
    uncached_home = tmp_path_factory.mktemp("uncached_hf_home")
    runs = {" ".join(argv): (argv, NO_GPU) for argv in MISSING_GPU}
    runs[" ".join(UNCACHED)] = (UNCACHED, {"HF_HUB_OFFLINE": "1", "HF_HOME": str(uncached_home)})
    runs["libraries"] = (LIBRARIES_AT_REFUSAL, {**NO_GPU, "HF_HUB_OFFLINE": "1", "HF_HOME": str(uncached_home)})
    started = {name: subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, "PYTHONPATH": str(ROOT), **env})
               for name, (argv, env) in runs.items()}
    yield started
    for process in started.values():
        process.kill()  # a no-op for one that ended
        process.communicate()


def finished(process: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.mark.slow
@pytest.mark.parametrize("argv", MISSING_GPU, ids=lambda argv: argv[0] if argv[0] == "app.py" else argv[2])
def test_a_missing_gpu_is_one_line_at_start_up(argv, start_ups):
    assert_one_line_refusal(finished(start_ups[" ".join(argv)]), "cuda", "--device cpu")


@pytest.mark.slow
def test_a_missing_gpu_and_an_uncached_model_are_refused_before_the_libraries_load(start_ups):
    """Before diffusers, transformers and Gradio load (~9 s more on 2 cores): ``cli.refuse_before_libraries``."""
    done = finished(start_ups["libraries"])
    assert done.stdout.strip().endswith("exit [2, 2] loaded: ['torch']"), (done.stdout, done.stderr)
    first, second = done.stderr.strip().splitlines()
    assert "no usable CUDA GPU" in first and "someone/not-cached" in second and "cache" in second


def test_only_commands_that_load_the_model_here_refuse_a_missing_device_early():
    """``plan --device cuda`` names the GPU box planned for, not this machine: it is never refused for a GPU
    this machine lacks (``loads_model_here`` is set by the flags of generate, check and grid only)."""
    from h3app.cli import build_parser

    parser, here = build_parser(), {}
    for argv in (["generate", "--prompt", "x", "--out", "x.mp4"], ["check", "--adapter", str(TURBO)],
                 ["grid", "--adapter", str(TURBO), "--prompt", "x", "--out-dir", "grid"], ["plan"],
                 ["inspect", str(TURBO)]):
        here[argv[0]] = getattr(parser.parse_args(argv), "loads_model_here", False)
    assert here == {"generate": True, "check": True, "grid": True, "plan": False, "inspect": False}


@pytest.mark.slow
def test_an_uncached_hub_model_offline_is_one_line_at_start_up(start_ups):
    assert_one_line_refusal(finished(start_ups[" ".join(UNCACHED)]), "MiniMaxAI/MiniMax-H3", "cache")


def test_inspect_stays_light_no_torch_is_imported():
    code = ("import sys; from h3app.cli import main; "
            f"code = main(['inspect', {str(ROOT / 'assets' / 'adapters' / 'kohya_musubi.safetensors')!r}, '--json']); "
            "print('torch loaded:', 'torch' in sys.modules, 'exit', code)")
    done = run_python("-c", code)
    assert done.stdout.strip().endswith("torch loaded: False exit 0"), done.stderr


def test_the_upload_policy_decides_the_suffix_the_cap_and_the_folder(tmp_path):
    from h3app.backend.adapter_binding import SourcePolicy
    from h3app.hosting.upload_policy import UPLOAD_PREFIX, UploadPolicy

    hosted = UploadPolicy.of(SourcePolicy(hosted=True, max_remote_bytes=10), tmp_path)
    with pytest.raises(H3AppError, match=r"^notes.pt is not a .safetensors file: only .safetensors adapters can be "
                                         r"uploaded \(pickles can run code\).$"):
        hosted.check_name("notes.pt")
    with pytest.raises(H3AppError, match="^big.safetensors is 11 B, over this server's limit of 10 B: use a smaller "
                                         "adapter.$"):
        hosted.check_size("big.safetensors", 11)
    hosted.check_name("a.SafeTensors")
    hosted.check_size("a.safetensors", 10)
    UploadPolicy.of(SourcePolicy(hosted=False, max_remote_bytes=10), tmp_path).check_size("big.safetensors", 11)
    first, second = hosted.destination("../elsewhere/a.safetensors"), hosted.destination("a.safetensors")
    assert first.name == "a.safetensors" and first.parent.parent == tmp_path and first.parent != second.parent
    assert first.parent.name.startswith(UPLOAD_PREFIX) and first.parent.is_dir()
