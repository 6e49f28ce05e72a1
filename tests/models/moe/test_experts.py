"""The MoE pieces against independent oracles: routing against a hand-worked softmax, the
experts (reference and C++ kernels) against a float64 per-token computation, and batch
invariance: a row's output alone equals, bit for bit, its output in a batch where the other
rows chose the same experts."""

from __future__ import annotations

import math

import pytest
import torch

from models import cpu_kernels
from models.moe.cpu_experts import CppExpertRunner
from models.moe.experts import GroupedExperts
from models.moe.router import route

E, H, I = 6, 64, 40  # noqa: E741 (the experts' intermediate width)


def test_route_hand_worked() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, math.log(3.0)]])
    z = 1 + math.e**2 + math.e + 3
    weights, experts = route(logits, 2, renormalize=False)
    assert experts.tolist() == [[1, 3]]  # e^2 > 3 > e > 1
    torch.testing.assert_close(weights, torch.tensor([[math.e**2 / z, 3 / z]]))
    weights, _ = route(logits, 2, renormalize=True)
    torch.testing.assert_close(weights, torch.tensor([[math.e**2, 3.0]]) / (math.e**2 + 3))


def make_experts(dtype: torch.dtype) -> GroupedExperts:
    gen = torch.Generator().manual_seed(0)
    experts = GroupedExperts(E, H, I)
    with torch.no_grad():
        experts.gate_up_proj.weight.copy_(torch.randn(E * 2 * I, H, generator=gen) * 0.2)
        experts.down_proj.weight.copy_(torch.randn(E * H, I, generator=gen) * 0.2)
    return experts.to(dtype)


def float64_oracle(experts: GroupedExperts, x, ids, weights) -> torch.Tensor:
    """Per token, sum over its top-k of weight * down(silu(gate x) * up x), in float64."""
    out = torch.zeros(x.shape[0], H, dtype=torch.float64)
    for t in range(x.shape[0]):
        for r in range(ids.shape[1]):
            e = int(ids[t, r])
            gu = experts.gate_up(e).double() @ x[t].double()
            gate, up = gu[:I], gu[I:]
            act = gate * torch.sigmoid(gate) * up
            out[t] += float(weights[t, r]) * (experts.down(e).double() @ act)
    return out


def with_runner(experts: GroupedExperts, kernel: bool) -> GroupedExperts:
    if kernel:
        ext = cpu_kernels.extension()
        if ext is None:
            pytest.skip("the C++ kernels cannot be built here")
        experts.run_expert = CppExpertRunner(experts, ext)
    return experts


def step_inputs(t: int, k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, H, generator=gen)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(t)])
    weights = torch.rand(t, k, generator=gen)
    return x, ids, weights


@pytest.mark.parametrize("kernel", [False, True], ids=["reference", "cpp"])
def test_experts_equal_a_float64_per_token_computation(kernel: bool) -> None:
    experts = with_runner(make_experts(torch.float32), kernel)
    x, ids, weights = step_inputs(11, 3, seed=1)
    got = experts(x, ids, weights)
    torch.testing.assert_close(got.double(), float64_oracle(experts, x, ids, weights),
                               atol=2e-5, rtol=1e-5)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kernel", [False, True], ids=["reference", "cpp"])
def test_a_row_alone_equals_it_among_rows_sharing_its_experts(kernel, dtype) -> None:
    experts = with_runner(make_experts(dtype), kernel)
    x, ids, weights = step_inputs(21, 2, seed=2)
    x = x.to(dtype)
    ids[:, 0], ids[:, 1] = 4, 1  # every row chose experts 4 then 1
    ids[::3] = torch.tensor([1, 4])  # and a third of them in the other order
    batch = experts(x, ids, weights)
    for t in (0, 1, 7, 20):
        alone = experts(x[t : t + 1], ids[t : t + 1], weights[t : t + 1])
        assert torch.equal(alone[0], batch[t]), f"row {t}"
