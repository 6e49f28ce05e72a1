"""The Triton experts (models/moe/triton_experts.py, interpreted on CPU) against the PyTorch
reference (GroupedExperts.forward), a hand-checked grouping, batch invariance, and what a
captured decode step needs: no host read, no data-dependent op, no tensor from host data."""

from __future__ import annotations

import pytest
import torch

from models.moe.experts import GroupedExperts
from tests.engine.test_host_syncs import recording
from tests.models.moe.test_experts import E, H, I, make_experts, step_inputs


def run(experts: GroupedExperts, x, ids, weights) -> torch.Tensor:
    from models.moe.triton_experts import triton_experts

    return triton_experts(x, ids, weights, experts.gate_up_proj.weight,
                          experts.down_proj.weight)  # fmt: skip


def test_slots_are_grouped_by_expert_in_blocks(triton_kernels) -> None:
    from models.moe.triton_experts import BLOCK_M, align_slots

    ids = torch.tensor([[2, 0], [2, 5], [0, 2]], device=triton_kernels)  # slots 0..5
    slots, block_expert = align_slots(ids, 6)
    # expert 0: slots 1, 4; expert 2: slots 0, 2, 5; expert 5: slot 3; padding 6
    blocks = slots.view(-1, BLOCK_M).tolist()
    assert block_expert.tolist() == [0, 2, 5, -1, -1, -1][: len(blocks)]
    assert [b[:3] for b in blocks[:3]] == [[1, 4, 6], [0, 2, 5], [3, 6, 6]]
    assert all(v == 6 for b in blocks for v in b[3:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_equals_the_reference(triton_kernels, dtype) -> None:
    experts = make_experts(dtype).to(triton_kernels)
    x, ids, weights = step_inputs(9, 3, seed=4)
    x, ids, weights = (
        x.to(triton_kernels, dtype),
        ids.to(triton_kernels),
        weights.to(triton_kernels),
    )
    want = experts(x, ids, weights)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.1, rtol=0.02)
    torch.testing.assert_close(run(experts, x, ids, weights), want, **tol)


def test_a_row_alone_equals_it_among_rows_sharing_its_experts(triton_kernels) -> None:
    experts = make_experts(torch.float32).to(triton_kernels)
    x, ids, weights = step_inputs(19, 2, seed=5)
    ids[:, 0], ids[:, 1] = 3, 0
    x, ids, weights = x.to(triton_kernels), ids.to(triton_kernels), weights.to(triton_kernels)
    batch = run(experts, x, ids, weights)
    for t in (0, 9, 18):  # rows in the first, a middle and the last block of expert 3
        assert torch.equal(run(experts, x[t : t + 1], ids[t : t + 1], weights[t : t + 1])[0],
                           batch[t])  # fmt: skip


def test_no_host_read_and_no_host_copy(cpu_triton, monkeypatch) -> None:
    """Everything but the launches (the interpreter copies their tensors: on a GPU a launch
    is a launch) is recorded: a decode step's experts can be captured."""
    from models.moe import triton_experts as module

    experts = make_experts(torch.float32)
    x, ids, weights = step_inputs(4, 2, seed=6)
    with recording(monkeypatch, host_copies=True) as rec:
        for name in ("_gate_up_kernel", "_down_kernel"):
            kernel = getattr(module, name)

            class Launch:
                def __init__(self, kernel) -> None:
                    self.kernel = kernel

                def __getitem__(self, grid):
                    def launch(*args, **kwargs):
                        rec.allowed += 1
                        try:
                            return self.kernel[grid](*args, **kwargs)
                        finally:
                            rec.allowed -= 1

                    return launch

            monkeypatch.setattr(module, name, Launch(kernel))
        out = run(experts, x, ids, weights)
    assert rec.syncs == []
    assert out.shape == (4, H) and E == 6 and I == 40
