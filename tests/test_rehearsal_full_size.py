"""The full-size rehearsal: MiniMax-H3's real sizes through h3app's own loader, LoRA engine, worker and pipeline on
fake CUDA, at 544p with the token counts the pipeline packs. Each rehearsal is one module-scoped run (t2va's is the
session's, shared with tests/test_preview_cost.py; the 33B transformer and the 32B conditioner are built on meta and
placed on fake CUDA in seconds; no weights exist)."""

from __future__ import annotations

import pytest
import torch

from h3app.hardware import full_size
from h3app.hardware.header_adapter import lightx2v_header
from h3app.hardware.rehearsal import RehearsalOptions, rehearse
from h3app.rules.h3_modules import FULL_SIZE_CONFIG, transformer_shapes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # a module fixture's rehearsal is in its first test
GIB = 2**30
TRANSFORMER_BYTES = 66_236_000_000  # 33.1 B parameters, bf16 with diffusers' fp32 islands (~61.7 GiB)


@pytest.fixture(scope="module")
def header():
    return lightx2v_header(transformer_shapes(FULL_SIZE_CONFIG), rank=128, alpha=8.0)


@pytest.fixture(scope="module")
def t2va(full_size_t2va_previewed):
    """The plain t2va request: the session's rehearsal of it (tests/rehearsal_fixtures.py), which also previews each
    step; the request's own phases, tokens and outputs are as without previews (tests/test_preview_cost.py)."""
    return full_size_t2va_previewed.rehearsal


@pytest.fixture(scope="module")
def fl2va_unmerged(header):
    return rehearse(RehearsalOptions(workflow="fl2va", resolution="544p", adapter=header, lora_mode="unmerged"))


@pytest.fixture(scope="module")
def fl2va_merged_fused(header):
    return rehearse(RehearsalOptions(workflow="fl2va", resolution="544p", adapter=header, lora_mode="merged",
                                     fuse_qkv=True))


@pytest.fixture(scope="module")
def ref2va():
    return rehearse(RehearsalOptions(workflow="ref2va", resolution="544p"))


@pytest.fixture(scope="module")
def t2va_check(header):
    return rehearse(RehearsalOptions(workflow="t2va", resolution="544p", adapter=header, equivalence=True))


def test_t2va_at_544p_packs_the_real_sequence(t2va):
    # 124 frames → 37 latent frames × (544/32) × (960/32) video rows; 5.17 s of stereo audio at 40 latents/s.
    assert t2va.tokens["video"] == 37 * 17 * 30
    assert t2va.tokens["audio"] == 2 * 207
    assert t2va.evaluations == 1
    assert t2va.video_shape == (124, 544, 960, 3)
    assert t2va.audio_shape == (2, 165_600)


def test_t2va_holds_the_real_weights(t2va):
    assert abs(t2va.components["transformer"] - TRANSFORMER_BYTES) < 0.01 * TRANSFORMER_BYTES
    assert 48 * GIB < t2va.components["text_encoder"] < 50 * GIB  # Qwen3-VL-32B cut to 51 layers, no LM head
    assert t2va.components["vae"] > 5 * GIB and t2va.components["audio_vae"] > 0
    assert "transformer_ref" not in t2va.components  # t2va loads its own partition only
    resident = sum(t2va.components.values())
    assert t2va.device_peak > resident  # plus activations
    assert 0 < t2va.phases["denoise"].transient < 16 * GIB  # fused attention: no L² scores
    assert t2va.phases["vae_decode"].transient > 0 and t2va.phases["text_encoder"].transient > 0


def test_fl2va_binds_all_312_lightx2v_targets_unmerged(fl2va_unmerged):
    result = fl2va_unmerged
    assert result.targets_bound == 312
    assert result.lora_bytes > GIB  # rank 128 × 312 targets, kept in fp32 on the device
    assert result.pristine_host_bytes == 0
    assert result.tokens["video"] > 37 * 17 * 30  # the keyframe's conditioning rows come first
    assert "vae_encode" in result.phases


def test_fl2va_merged_with_fused_qkv_keeps_pristine_copies_on_the_host(fl2va_merged_fused):
    result = fl2va_merged_fused
    assert result.targets_bound == 312
    # every bound Linear's bf16 weight is copied once to the host (q/k/v as one fused to_qkv): LightX2V's targets
    # hold 20.0 B parameters, 37.3 GiB in bf16 (docs/lora-engine.md, "Memory at full size")
    assert 37 * GIB < result.pristine_host_bytes < 37.5 * GIB
    assert result.host_peak >= result.pristine_host_bytes


def test_ref2va_runs_on_its_own_partition(ref2va):
    assert "transformer_ref" in ref2va.components and "transformer" not in ref2va.components
    assert ref2va.tokens["video"] > 37 * 17 * 30  # the reference image's rows


def test_full_size_components_are_built_without_memory():
    from h3app.model.loader import LoadOptions

    module = full_size.build_meta("transformer", LoadOptions(dtype=torch.bfloat16))
    assert next(module.parameters()).is_meta
    assert module.proj_in.weight.dtype == torch.float32  # diffusers' fp32 islands, as from_pretrained keeps them
    assert abs(full_size.parameter_bytes(module) - TRANSFORMER_BYTES) < 0.01 * TRANSFORMER_BYTES


def test_each_caller_gets_its_own_copy_of_the_module_built_once():
    """``build_meta`` builds the released sizes once and hands out copies: what one rehearsal's loader does to its
    module (cast, move) never reaches the next, and the copies are real meta modules also under fake CUDA."""
    from h3app.hardware.fake_cuda import fake_cuda
    from h3app.model.loader import LoadOptions, decoder_dtype

    options = LoadOptions(dtype=torch.bfloat16)
    first = full_size.build_meta("audio_vae", options)  # weight-normed convolutions: the slow one to build
    first.to(torch.float16)
    with fake_cuda():
        second = full_size.build_meta("audio_vae", options)
    assert second is not first and {id(p) for p in second.parameters()}.isdisjoint(map(id, first.parameters()))
    assert {p.dtype for p in second.parameters()} == {torch.float32} and all(p.is_meta for p in second.parameters())
    key = ("audio_vae", options.dtype, decoder_dtype(options), options.fuse_qkv)
    assert key in full_size._BUILT  # built once, kept
    assert sorted(second.state_dict()) == sorted(first.state_dict())


def test_the_equivalence_check_runs_at_full_size_with_the_lightx2v_adapter(t2va_check):
    """The backend's own check (A 8:1.0, the control, B 128:0.0625, the fallback) at 544p on fake CUDA: every
    placement, cast and shape holds; the comparison itself is reported as not measurable."""
    check = t2va_check.check
    assert check.a == "8:1" and check.b == "128:0.0625"
    assert check.phases == ("fallback", "A", "control", "B")
    assert check.evaluations == 3 * 1 + 1
    assert check.targets_bound == 312
    assert check.effective_scale_a == check.effective_scale_b == 8.0 / 128  # rank 128
    assert check.effective_scale_fallback == 1.0
    assert "not measurable on fake tensors" in check.comparison
    assert t2va_check.tokens["video"] == 37 * 17 * 30
    assert t2va_check.phases["vae_decode"].transient > 0 and t2va_check.phases["denoise"].transient > 0
