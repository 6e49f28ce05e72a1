"""The sampler with its row softmax taken by the fused Triton kernel (forced on CPU through
Triton's interpreter; on CUDA it is the default) gives the PyTorch path's answer: the same
tokens for greedy, temperature-only seeded rows and filtered rows, and logprobs within float32
tolerance. CPU runs never take the kernel unless forced."""

from __future__ import annotations

import pytest
import torch

import models.triton_kernels as kernels_switch
from engine.requests.sampling_params import SamplingParams
from engine.sampling.sampler import Sampler, seeded_generator
from engine.sampling.sampling_batch import SamplingRow
from tests.devices import selected_device

PARAMS = [
    SamplingParams(temperature=0.0, logprobs=3),
    SamplingParams(temperature=0.7, seed=1, logprobs=2),
    SamplingParams(temperature=1.3, seed=2),
    SamplingParams(temperature=0.9, seed=3, top_k=10, logprobs=1),
]


def _sample(logits: torch.Tensor, rows_of: list[SamplingParams]):
    rows = [SamplingRow(p, generator=seeded_generator(p.seed) if p.seed else None) for p in rows_of]
    return Sampler(seed=0)(logits[: len(rows)], rows)


@pytest.mark.parametrize("batch", [PARAMS, PARAMS[1:3]], ids=["mixed", "temperature-only"])
def test_forced_kernel_gives_the_pytorch_answer(batch, monkeypatch) -> None:
    if selected_device().type != "cpu":
        pytest.skip("forcing is for CPU runs; on a GPU the sampler tests take the kernel")
    from models.triton_kernels import row_softmax

    logits = torch.randn(4, 700, generator=torch.Generator().manual_seed(5)) * 3
    want = _sample(logits, batch)
    calls = []
    kernel = row_softmax.row_softmax
    monkeypatch.setattr(row_softmax, "row_softmax", lambda *a: calls.append(1) or kernel(*a))
    monkeypatch.setattr(kernels_switch, "enabled", lambda x: True)
    got = _sample(logits, batch)
    assert calls  # the kernel ran
    assert got.token_ids == want.token_ids
    for g, w in zip(got.logprobs, want.logprobs, strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            assert g.token_id == w.token_id and [t for t, _ in g.top] == [t for t, _ in w.top]
            assert g.logprob == pytest.approx(w.logprob, abs=1e-5)
