"""The routed experts of a step in two Triton launches (the GPU path of models/moe/experts.py).

Contract: `triton_experts(x [T, H], experts [T, k], weights [T, k] float32, gate_up [E * 2I, H],
down [E * H, I]) -> [T, H]` in x's dtype, GroupedExperts.forward's result up to rounding: the
gate and up products stay float32 through SiLU x up, rounded once to x's dtype (the
reference rounds gate and up first). `align_slots` is the grouping, tested on its own.

How: the T * k (token, rank) slots are sorted by expert (stable: by slot id inside an expert)
and laid out in blocks of BLOCK_M rows, each expert's slots starting a new block, padding
slots marked with the sentinel T * k (`align_slots`, torch ops of fixed shapes: a scatter-add
count, a stable argsort, a searchsorted of block starts). One launch computes every block's
SiLU(x Wg^T) * (x Wu^T) with its expert's rows, one the down projection; each program walks
K in BLOCK_K steps from 0 (`ordered_dot`), so a slot's values never depend on the other slots
sharing its expert (batch invariance), and the weighted sum over ranks is the reference's
(rank order, float32).

Capture-safe: no host read, no data-dependent shape: the block count is bounded by the step's
shape alone (min(T * k, ceil(T * k / BLOCK_M) + E) blocks; a block past the used ones has
expert -1 and stores nothing), so a decode step of a fixed batch size is one fixed graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from models.moe.experts import weighted_sum
from models.triton_kernels.ordered_dot import ordered_dot

BLOCK_M, BLOCK_N, BLOCK_K = 16, 32, 32


def align_slots(experts: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """experts [T, k] -> (slot ids [num_blocks * BLOCK_M] int64, sorted by expert, each
    expert's run starting a block, padding = T * k; expert of each block [num_blocks], -1
    past the used blocks)."""
    flat = experts.reshape(-1)  # [S]: slot s = token s // k, rank s % k
    s, device = flat.numel(), flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = padded.cumsum(0)  # [E]: end of each expert's padded run
    order = torch.argsort(flat, stable=True)  # slots by expert, by slot id inside one
    by_expert = flat[order]
    rank = torch.arange(s, device=device) - (counts.cumsum(0) - counts)[by_expert]
    num_blocks = min(s, triton.cdiv(s, BLOCK_M) + num_experts)
    slots = torch.full((num_blocks * BLOCK_M,), s, dtype=torch.int64, device=device)
    slots[(ends - padded)[by_expert] + rank] = order
    starts = torch.arange(num_blocks, device=device) * BLOCK_M
    block_expert = torch.searchsorted(ends, starts, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return slots, block_expert


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, slot_ptr, block_expert_ptr, act_ptr, S, K, INTER, TOP_K,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):  # fmt: skip
    b = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    e = tl.load(block_expert_ptr + b + tl.zeros([BLOCK_M], dtype=tl.int32))  # [BLOCK_M], alike
    slots = tl.load(slot_ptr + b * BLOCK_M + tl.arange(0, BLOCK_M))  # [BLOCK_M]
    live = (slots < S) & (e >= 0)
    tokens = slots // TOP_K
    gate_rows = tl.maximum(tl.max(e, axis=0), 0).to(tl.int64) * 2 * INTER + rn  # [BLOCK_N] of w
    rk = tl.arange(0, BLOCK_K)
    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(x_ptr + tokens[:, None] * K + kk[None, :],
                    mask=live[:, None] & (kk[None, :] < K), other=0.0)  # fmt: skip
        w_mask = (rn[None, :] < INTER) & (kk[:, None] < K)
        wg = tl.load(w_ptr + gate_rows[None, :] * K + kk[:, None], mask=w_mask, other=0.0)
        wu = tl.load(w_ptr + (gate_rows + INTER)[None, :] * K + kk[:, None], mask=w_mask, other=0.0)
        gate += ordered_dot(x, wg, PRECISION, INTERPRETED)
        up += ordered_dot(x, wu, PRECISION, INTERPRETED)
    act = gate / (1.0 + tl.exp(-gate)) * up
    out = act_ptr + slots[:, None] * INTER + rn[None, :]
    tl.store(out, act.to(act_ptr.dtype.element_ty), mask=live[:, None] & (rn[None, :] < INTER))


@triton.jit
def _down_kernel(act_ptr, w_ptr, slot_ptr, block_expert_ptr, out_ptr, S, K, N,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):  # fmt: skip
    b = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    e = tl.load(block_expert_ptr + b + tl.zeros([BLOCK_M], dtype=tl.int32))  # [BLOCK_M], alike
    slots = tl.load(slot_ptr + b * BLOCK_M + tl.arange(0, BLOCK_M))
    live = (slots < S) & (e >= 0)
    rows = tl.maximum(tl.max(e, axis=0), 0).to(tl.int64) * N + rn  # [BLOCK_N]: expert's rows
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(act_ptr + slots[:, None] * K + kk[None, :],
                    mask=live[:, None] & (kk[None, :] < K), other=0.0)  # fmt: skip
        w = tl.load(w_ptr + rows[None, :] * K + kk[:, None],
                    mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0)  # fmt: skip
        acc += ordered_dot(a, w, PRECISION, INTERPRETED)
    out = out_ptr + slots[:, None] * N + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=live[:, None] & (rn[None, :] < N))


def triton_experts(
    x: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
) -> torch.Tensor:
    t, hidden = x.shape
    top_k, inter = experts.shape[1], down.shape[1]
    num_experts = gate_up.shape[0] // (2 * inter)
    s = t * top_k
    slots, block_expert = align_slots(experts, num_experts)
    x = x.contiguous()
    act = torch.empty(s, inter, dtype=x.dtype, device=x.device)  # [S, I]
    out = torch.empty(s, hidden, dtype=x.dtype, device=x.device)  # [S, H]: slot outputs
    common = dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                  PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                  INTERPRETED=not x.is_cuda)  # fmt: skip
    blocks = block_expert.numel()
    _gate_up_kernel[(blocks, triton.cdiv(inter, BLOCK_N))](
        x, gate_up, slots, block_expert, act, s, hidden, inter, top_k, **common
    )
    _down_kernel[(blocks, triton.cdiv(hidden, BLOCK_N))](
        act, down, slots, block_expert, out, s, inter, hidden, **common
    )
    return weighted_sum(out.view(t, top_k, hidden), weights).to(x.dtype)
