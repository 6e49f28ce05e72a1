"""The C++ step over an int8 K/V cache (`--kv-cache-dtype int8`, models/kv_quant.py), on tiny
transformers checkpoints:

- its logits equal those of the PyTorch reference path (the model's own layers, key-block
  attention in float32) whose K/V write stores each row rounded through the int8 layout
  (quantise, then dequantise): the int8 path computes exactly "attention over the rounded
  rows", to float32 tolerance, while the float cache's logits differ from it by far more; so
  do the PyTorch layers with the C++ attention (GPT-2: the path of models the C++ step does not
  run; the same C++ append, kv_int8.h);
- a sequence gets the same logits and the same int8 rows alone or beside other sequences'
  prefill chunks and decodes (bit for bit), in float32 and bfloat16 models;
- the same for `--kv-cache-dtype int8v` (float16 K rows as models/kv_half.py rounds them, int8 V
  rows) in a float32 model."""

from __future__ import annotations

import pytest
import torch

from models.attention_backend import BlockAttentionBackend
from models.cpu_kernels.fused_decoder import FusedDecoder
from models.forward_path import PyTorchPath
from models.kv_half import to_half_rows
from models.kv_quant import dequantize_rows, quantize_rows
from tests.checkpoints import make_hf_model
from tests.models import test_cpu_kernel_invariance as invariance
from tests.models.paged_driver import PagedDriver
from tests.models.test_fused_decoder import ours_from, prompts

pytestmark = pytest.mark.cpu_kernels  # skipped off the CPU (tests/conftest.py)


class RoundedRowsBackend(BlockAttentionBackend):
    """The PyTorch key-block attention over a float cache whose rows are written as the int8
    layout stores them (the reference of the int8 path); `half_k`: K rows rounded to float16
    instead (int8v)."""

    half_k = False

    def write_kv(self, cache, k, v, meta) -> None:
        def rounded(x):
            return dequantize_rows(quantize_rows(x)).to(x.dtype)

        k = to_half_rows(k).to(k.dtype) if self.half_k else rounded(k)
        super().write_kv(cache, k, rounded(v), meta)


def run_steps(driver: PagedDriver, path, tokens: list[list[int]]) -> torch.Tensor:
    """Prefills of every prompt in one step, then 4 greedy-free decode steps of fixed tokens;
    returns every step's logits, concatenated [rows, vocab]."""
    seqs = [driver.add_sequence() for _ in tokens]
    out = [torch.cat(list(driver.step(dict(zip(seqs, tokens, strict=True)), fused=path).values()))]
    for i in range(4):
        step = {s: [3 + (7 * i + s) % 50] for s in seqs}
        out.append(torch.cat(list(driver.step(step, fused=path).values())))
    return torch.cat(out)


def int8_path(ours, driver: PagedDriver, path: str):
    if path == "step":  # the whole step in C++
        return FusedDecoder.build(ours, driver.kv)
    return PyTorchPath(ours, driver.kv, attention_kernel=True)  # PyTorch layers, C++ attention


@pytest.mark.parametrize(
    "arch,path,kind",
    [
        ("llama", "step", "int8"),
        ("qwen2", "step", "int8"),
        ("gpt2", "layers", "int8"),
        ("llama", "step", "int8v"),
        ("gpt2", "layers", "int8v"),
    ],
)
def test_int8_logits_equal_the_reference_over_rounded_rows(arch, path, kind) -> None:
    ours = ours_from(make_hf_model(arch), torch.float32)
    tokens = prompts((9, 21, 14), seed=2)
    int8 = PagedDriver(ours, kv_cache_dtype=kind)
    got = run_steps(int8, int8_path(ours, int8, path), tokens)
    ref = PagedDriver(ours)
    path = PyTorchPath(ours, ref.kv, attention_kernel=False)
    path.attention = RoundedRowsBackend.for_model(ours, ref.kv)
    path.attention.half_k = kind == "int8v"
    want = run_steps(ref, path, tokens)
    plain = PagedDriver(ours)
    unrounded = run_steps(plain, int8_path(ours, plain, path), tokens)
    err = float((got - want).abs().max())
    moved = float((unrounded - want).abs().max())
    assert err <= 2e-5, err
    assert moved >= 20 * err, (moved, err)  # the rounding is seen, and reproduced


@pytest.mark.parametrize(
    "dtype,kind", [(torch.float32, "int8"), (torch.bfloat16, "int8"), (torch.float32, "int8v")]
)
def test_the_int8_step_gives_a_sequence_the_same_bits_alone_or_batched(dtype, kind) -> None:
    invariance.test_the_cpp_step_gives_a_sequence_the_same_bits_alone_or_batched(
        dtype, "qwen3", kind
    )
