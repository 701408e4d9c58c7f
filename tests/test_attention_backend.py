"""The attention backend: the auto rule per card (rules/attention.py), the one-line refusals, the setting through
diffusers' dispatcher (model/attention.py), the start-up line and the check's refusal of an approximate backend.

No GPU here: the card is a monkeypatched ``torch.cuda.get_device_capability`` and the installed kernels a patched
set, which is what the choice reads; a kernel itself never runs. What does run is real: the tiny transformer's
processors set through ``set_attention_backend``, and the VAE decoding afterwards on the CPU (it would fail if the
process-wide default had been left at a CUDA-only backend)."""

from __future__ import annotations

import pytest
import torch
from cli_runner import assert_one_line, run_cli

from h3app.errors import H3AppError
from h3app.model import attention as model_attention
from h3app.model.loader import LoadOptions, attention_of, load_transformer
from h3app.rules import attention as rule
from h3app.rules.attention import BLACKWELL, CUDNN, FA2, FA3, HOPPER, RING, SAGE, SDPA, ULYSSES

ALL = frozenset(b.module for b in rule.ATTENTION_BACKENDS if b.module)


@pytest.mark.parametrize(("capability", "arch"), [((9, 0), HOPPER), ((10, 0), BLACKWELL), ((12, 0), BLACKWELL),
                                                  ((8, 0), "sm80"), ((8, 9), "sm89"), (None, None)])
def test_arch_of_capability(capability, arch):
    assert rule.arch_of(capability) == arch


@pytest.mark.parametrize(("arch", "installed", "half", "split", "expected"), [
    (HOPPER, ALL, True, "", FA3),  # Hopper: FlashAttention 3 when installed
    (HOPPER, frozenset(), True, "", CUDNN),  # … else cuDNN (in torch)
    (HOPPER, ALL, True, ULYSSES, CUDNN),  # diffusers 0.42.1's local FA3 has no context parallel
    (HOPPER, ALL, True, RING, CUDNN),  # ring merges by the log-sum-exp cuDNN returns
    (BLACKWELL, ALL, True, "", CUDNN),
    (BLACKWELL, ALL, True, ULYSSES, CUDNN),
    ("sm80", ALL, True, "", SDPA),  # elsewhere SDPA, even with flash-attn installed
    (HOPPER, ALL, False, "", SDPA),  # float32: the fast kernels need bf16/fp16
    (None, ALL, True, "", SDPA),  # the CPU: nothing changes
])
def test_auto_picks_the_fastest_exact_backend_that_can_run(arch, installed, half, split, expected):
    chosen = rule.choose(arch, installed, rule.AUTO, half=half, split=split)
    assert chosen is expected and chosen.exact


def test_auto_never_picks_an_approximate_backend():
    for arch in (HOPPER, BLACKWELL, "sm80", None):
        for split in ("", ULYSSES, RING):
            assert rule.choose(arch, ALL, half=True, split=split).exact


@pytest.mark.parametrize(("name", "arch", "installed", "half", "split", "names"), [
    ("fa3", HOPPER, frozenset(), True, "", "flash_attn_interface"),
    ("flash", HOPPER, frozenset(), True, "", "install flash-attn"),
    ("sage", BLACKWELL, frozenset(), True, "", "install sageattention"),
    ("cudnn", None, ALL, True, "", "CUDA GPUs only"),
    ("fa3", HOPPER, ALL, False, "", "--dtype bfloat16"),
    ("fa3", HOPPER, ALL, True, ULYSSES, "no context-parallel support"),
    ("flash", HOPPER, ALL, True, RING, "cannot run --ring"),
])
def test_a_named_backend_that_cannot_run_is_one_line_naming_the_fix(name, arch, installed, half, split, names):
    line = rule.refusal(rule.BY_NAME[name], arch, installed, half=half, split=split)
    assert line is not None and "\n" not in line and names in line and f"--attention {name}" in line


def test_a_named_backend_that_can_run_is_not_refused():
    assert rule.refusal(FA3, HOPPER, ALL) is None
    assert rule.refusal(CUDNN, BLACKWELL, frozenset(), split=RING) is None
    assert rule.refusal(SDPA, None, frozenset(), half=False) is None


@pytest.fixture
def hopper(monkeypatch):
    """A Hopper card for the choice: its capability, and flash_attn_interface 'installed' (never imported)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(model_attention, "installed", lambda: frozenset({"flash_attn_interface"}))


def test_the_loader_reads_the_card_and_what_is_installed(hopper):
    assert model_attention.chosen("cuda", torch.bfloat16) is FA3
    assert model_attention.chosen("cuda", torch.bfloat16, split=ULYSSES) is CUDNN
    assert model_attention.chosen("cuda", torch.float32) is SDPA
    assert model_attention.chosen("cpu", torch.bfloat16) is SDPA
    with pytest.raises(H3AppError, match="install flash-attn"):
        model_attention.chosen("cuda", torch.bfloat16, "flash")
    assert "FlashAttention 3 (fa3, auto for this Hopper GPU)" in rule.describe(FA3, HOPPER)


def test_on_the_cpu_nothing_is_set(tiny_model):
    """The session's tiny model: SDPA by the rule, and no processor names a backend (diffusers' default runs)."""
    assert tiny_model.attention is SDPA
    processors = [m.processor for m in tiny_model.transformer().modules() if hasattr(m, "processor")]
    assert processors and all(p._attention_backend is None for p in processors)


def test_a_backend_is_set_on_the_transformer_alone():
    """cuDNN set on a tiny transformer (set, not run: it needs CUDA): its processors name it, and the VAE decodes on
    the CPU afterwards, so the process-wide default went back to SDPA."""
    from diffusers import AutoencoderKLMiniMaxH3

    from h3app.model.repo import locate

    transformer = load_transformer("tiny")
    model_attention.apply(transformer, CUDNN)
    processors = [m.processor for m in transformer.modules() if hasattr(m, "processor")]
    assert processors and all(p._attention_backend == CUDNN.dispatcher for p in processors)
    vae = AutoencoderKLMiniMaxH3.from_pretrained(str(locate("tiny").folder), subfolder="vae").eval()
    with torch.no_grad():
        frames = vae.decode(torch.randn(1, 4, 7, 4, 4, generator=torch.Generator().manual_seed(0))).sample
    assert torch.isfinite(frames).all()


def test_load_options_refuse_a_named_backend_before_loading():
    with pytest.raises(H3AppError, match="CUDA GPUs only"):
        LoadOptions(attention="fa3")
    assert attention_of(LoadOptions(attention="sdpa")) is SDPA


def test_check_with_an_approximate_backend_is_refused_in_one_line(capsys):
    result = run_cli(capsys, "check", "--adapter", "a", "--attention", "sage")
    assert result.code == 2
    assert_one_line(result.err, r"--attention sage is approximate")


def test_the_equivalence_check_refuses_a_model_loaded_with_sage():
    """The backend's own refusal (the app's Equivalence tab and API): before any run, whatever else is given."""
    from types import SimpleNamespace

    from h3app.backend.equivalence import run_equivalence

    binder = SimpleNamespace(model=SimpleNamespace(attention=SAGE))
    with pytest.raises(H3AppError, match="approximate"):
        run_equivalence(binder, None, None, outputs=None)  # type: ignore[arg-type]
    assert rule.check_refusal(FA3) is None and rule.check_refusal(FA2) is None


def test_the_start_up_line_names_the_backend(hopper):
    assert model_attention.startup_line(LoadOptions()) == "attention: PyTorch SDPA (sdpa, auto for the CPU)"
    options = LoadOptions(dtype=torch.bfloat16)
    object.__setattr__(options, "device", "cuda")  # the card is patched; LoadOptions would refuse a missing GPU
    assert model_attention.startup_line(options) == "attention: FlashAttention 3 (fa3, auto for this Hopper GPU)"


@pytest.mark.slow
def test_the_app_refuses_a_backend_that_cannot_run_in_one_line():
    """app.py itself: the refusal comes before the model, Gradio or any rank loads (exit 2, one error line)."""
    import os
    import subprocess
    import sys

    from cli_runner import ROOT

    done = subprocess.run([sys.executable, "app.py", "--attention", "flash"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2
    assert_one_line(done.stderr, r"--attention flash runs on CUDA GPUs only")


@pytest.mark.slow  # loads the tiny transformer and an adapter in the CLI
def test_check_json_names_the_backend_every_run_used(capsys):
    """Transformer mode on the CPU: SDPA, named in the JSON beside a bit-identical pair."""
    import json

    from cli_runner import ROOT

    turbo = str(ROOT / "assets" / "adapters" / "lightx2v_turbo_no_alpha.safetensors")
    result = run_cli(capsys, "check", "--adapter", turbo, "--attention", "sdpa", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["attention"] == "sdpa" and data["identical"] is True and data["control_identical"] is True


def test_the_transformer_check_reports_the_backend_the_transformer_runs():
    """``check --json``'s ``attention_backend`` is the backend set on the transformer (``model.attention.in_use``),
    not a fixed ``native``. A backend that runs on the CPU (diffusers' math SDPA, no rule entry: the app never
    picks it) is set for real and the check runs in it."""
    from lora_fixtures import block_targets, build_tiny, linear_shapes, make_adapter

    from h3app.backend.transformer_check import run_transformer_check
    from h3app.rules.check_pair import CheckSetting

    math = rule.AttentionBackend("math", "_native_math", None, True, label="math SDPA", half_only=False,
                                 cuda_only=False)
    plain, set_one = build_tiny(), build_tiny()
    adapter = make_adapter(linear_shapes(plain), block_targets(linear_shapes(plain)), rank=4, alpha=None)
    model_attention.apply(set_one, math)
    assert model_attention.in_use(set_one) is math and model_attention.in_use(plain) is SDPA
    pair = {"a": CheckSetting(8.0, 1.0), "b": CheckSetting(16.0, 0.5)}
    assert run_transformer_check(plain, adapter, **pair)["attention_backend"] == "native"
    result = run_transformer_check(set_one, adapter, **pair)
    assert result["attention_backend"] == "_native_math" and result["identical"] is True
