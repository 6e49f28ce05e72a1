"""The CUDA forward path (models/forward_path.py `TritonPath`: the model's layers with the
Triton K/V write and attention) computes what the model's own PyTorch forward computes, step
after step of prefill chunks and decodes, on a GQA model with a sliding window (the tiny
Mistral: 3 query heads per KV head, window 8) — on CPU through Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from models.forward_path import TritonPath
from tests.checkpoints import make_hf_model
from tests.models.paged_driver import PagedDriver
from tests.models.test_fused_decoder import ours_from

# Per step, new tokens per sequence: prefills, then a decode beside a prefill chunk, then a
# chunk crossing the sliding window beside decodes.
STEPS = [{0: 11, 1: 3}, {0: 1, 1: 9, 2: 5}, {0: 1, 1: 1, 2: 12}]


def test_triton_path_steps_equal_the_models_forward(triton_kernels) -> None:
    if triton_kernels.type != "cpu":
        pytest.skip("PagedDriver keeps its caches on CPU; the CUDA runs are the engine tests")
    model = ours_from(make_hf_model("mistral"), torch.float32)
    eager, triton = PagedDriver(model, block_size=4), PagedDriver(model, block_size=4)
    path = TritonPath(model, triton.kv)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        eager.add_sequence()
        triton.add_sequence()
    for step in STEPS:
        new = {s: torch.randint(3, 300, (n,), generator=gen).tolist() for s, n in step.items()}
        want = eager.step(new)
        got = triton.step(new, fused=path)
        for seq in new:
            torch.testing.assert_close(got[seq], want[seq], atol=1e-4, rtol=0)
    # layer 0's K/V come from the embeddings alone: stored bit for bit; later layers' K/V
    # carry the two attentions' float32 rounding differences
    assert all(torch.equal(got, want) for got, want in zip(triton.kv[0], eager.kv[0], strict=True))
    for (k_want, v_want), (k_got, v_got) in zip(eager.kv[1:], triton.kv[1:], strict=True):
        torch.testing.assert_close(k_got, k_want, atol=1e-5, rtol=0)
        torch.testing.assert_close(v_got, v_want, atol=1e-5, rtol=0)
