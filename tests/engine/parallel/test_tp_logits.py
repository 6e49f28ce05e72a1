"""Tensor parallel over 2 gloo ranks computes what one process computes: the same logits
(fp32 within 1e-5, bf16 within bf16 rounding) for GQA (llama), qkv bias (qwen2) and a
sliding window (mistral), mixture-of-experts (qwen2_moe in the C++ step, qwen3_moe on
the PyTorch layers), on the PyTorch layers and on the C++ step, and for Phi-3's fused
checkpoint matrices with LongRoPE (the script's longer sequence crosses its original length)
on the C++ step, and gpt-oss (sinks, biased clamped-SwiGLU experts), through prefill chunks, decodes, a copy-on-write block copy and
prompt-logprob rows."""

from __future__ import annotations

import pytest
import torch

from tests.checkpoints import save_checkpoint
from tests.engine.parallel.tp_driver import run_tp, run_tp1
from tests.family_checkpoints import save_family_checkpoint
from tests.models.gpt_oss.checkpoint import save_gpt_oss

ARCHS = ("llama", "qwen2", "mistral")
CASES = [(arch, "float32", kernels) for arch in ARCHS for kernels in (False, True)]
CASES.append(("llama", "bfloat16", True))
CASES.append(("phi3-longrope", "float32", True))
# Mixture of experts (each expert sharded like a dense MLP: models/moe/parallel.py): Qwen2-MoE's
# shared expert and qkv bias in the C++ step, Qwen3-MoE's dense layer on PyTorch.
MOE_CASES = [("qwen2_moe", "float32", True), ("qwen3_moe", "float32", False)]
CASES += MOE_CASES
# gpt-oss (models/gpt_oss/parallel.py): sinks split by head, biased experts by column, its own
# PyTorch layers (no kernel takes sinks); the script's sequences cross its window of 8.
CASES.append(("gpt_oss", "float32", True))


@pytest.fixture(scope="module")
def tp2_results(tmp_path_factory):
    """Every case once at TP=1 (here) and at TP=2 (one pair of spawned ranks for all)."""
    root = tmp_path_factory.mktemp("tp")
    folders = {arch: save_checkpoint(arch, root / arch) for arch in ARCHS}
    folders |= {arch: save_checkpoint(arch, root / arch) for arch, _, _ in MOE_CASES}
    folders["phi3-longrope"] = save_family_checkpoint("phi3-longrope", root / "phi3")
    folders["gpt_oss"] = save_gpt_oss(root / "gpt_oss")
    runs = run_tp([(folders[a], d, k) for a, d, k in CASES])
    return {
        case: (run_tp1(folders[case[0]], case[1], case[2]), *run)
        for case, run in zip(CASES, runs, strict=True)
    }


def _compare(want, got, atol: float) -> None:
    assert len(want) == len(got)
    for w, g in zip(want, got, strict=True):
        assert w.shape == g.shape
        torch.testing.assert_close(g, w, atol=atol, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cpu_kernels", [False, True], ids=["pytorch", "cpp_step"])
def test_tp2_logits_equal_tp1_in_fp32(tp2_results, arch, cpu_kernels) -> None:
    want, got, description = tp2_results[(arch, "float32", cpu_kernels)]
    assert ("C++ CPU kernels" in description) == cpu_kernels
    _compare(want, got, atol=1e-5)


def test_tp2_logits_equal_tp1_in_bf16(tp2_results) -> None:
    want, got, _ = tp2_results[("llama", "bfloat16", True)]
    scale = max(w.abs().max().item() for w in want)
    _compare(want, got, atol=0.03 * scale)


def test_tp2_phi3_longrope_logits_equal_tp1(tp2_results) -> None:
    want, got, description = tp2_results[("phi3-longrope", "float32", True)]
    assert "C++ CPU kernels" in description
    _compare(want, got, atol=1e-5)


@pytest.mark.parametrize("case", MOE_CASES, ids=[arch for arch, _, _ in MOE_CASES])
def test_tp2_moe_logits_equal_tp1_in_fp32(tp2_results, case) -> None:
    want, got, description = tp2_results[case]
    assert ("C++ CPU kernels" in description) == case[2]  # the C++ step, its sparse blocks too
    _compare(want, got, atol=1e-5)


def test_tp2_gpt_oss_logits_equal_tp1_in_fp32(tp2_results) -> None:
    want, got, description = tp2_results[("gpt_oss", "float32", True)]
    assert description.startswith("PyTorch ops only")  # asked for the kernels: none takes sinks
    _compare(want, got, atol=1e-5)
