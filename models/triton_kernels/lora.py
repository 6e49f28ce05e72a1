"""LoRA adapters' batched shrink / expand on the GPU, each row its own adapter slot, in two
Triton launches per projection (the layout of models/lora/stack.py: a [slots, S*R, K],
b [slots, R, N] (lora_B transposed), scales [slots, N] float32, slices at `offsets`).

Contract: `lora_add(x [T, K], y [T, N], rows [T] int64, a, b, scales, offsets) -> y + deltas`
(a new tensor), rows of -1 unchanged (their programs run on slot 0 and keep y); the same rounding points as `LoraStack.reference_add`:
the shrink rounded to the dtype, the expand too, the scaled delta too, then one add.
Capture-safe: no host read, no branch on tensor values in Python (a row's slot is read by its
programs on the device).

Order (batch invariance): shrink program (t, jb) computes u[t, j] for a block of j over K in
tiles of BLOCK_K, each tile's products summed by `tl.sum` and the tiles in order; expand program
(t, nb) computes acc[n] over r in order. Neither depends on the other rows of the step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_K = 64
BLOCK_J = 16
BLOCK_N = 128


@triton.jit
def _shrink(x_ptr, u_ptr, rows_ptr, a_ptr, K, SR, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    js = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    slot = tl.maximum(tl.load(rows_ptr + t), 0)  # a base row's u is computed and never used
    jmask = js < SR
    acc = tl.zeros([BLOCK_J], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < K
        xv = tl.load(x_ptr + t * K + ks, mask=kmask, other=0.0).to(tl.float32)
        a_rows = a_ptr + (slot * SR + js)[:, None] * K + ks[None, :]
        av = tl.load(a_rows, mask=jmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(av * xv[None, :], axis=1)
    tl.store(u_ptr + t * SR + js, acc.to(u_ptr.dtype.element_ty), mask=js < SR)


@triton.jit
def _expand(
    u_ptr, y_ptr, out_ptr, rows_ptr, b_ptr, scale_ptr, slice_ptr, N, SR, R, BLOCK_N: tl.constexpr
):
    t = tl.program_id(0).to(tl.int64)
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = ns < N
    row_slot = tl.load(rows_ptr + t)
    slot = tl.maximum(row_slot, 0)  # base rows (-1) read slot 0 and keep y (below)
    active = nmask
    first = tl.load(slice_ptr + ns, mask=nmask, other=0) * R  # u's rank segment of n's slice
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for r in range(0, R):
        ur = tl.load(u_ptr + t * SR + first + r, mask=active, other=0.0).to(tl.float32)
        br = tl.load(b_ptr + (slot * R + r) * N + ns, mask=active, other=0.0).to(tl.float32)
        acc += ur * br
    y = tl.load(y_ptr + t * N + ns, mask=nmask, other=0.0)
    scale = tl.load(scale_ptr + slot * N + ns, mask=active, other=0.0)
    delta = (acc.to(y.dtype).to(tl.float32) * scale).to(y.dtype)
    keep = (scale == 0.0) | (row_slot < 0)  # the base model, or a slice the adapter leaves out
    out = tl.where(keep, y, (y.to(tl.float32) + delta.to(tl.float32)).to(y.dtype))
    tl.store(out_ptr + t * N + ns, out, mask=nmask)


def slice_of_outputs(offsets: torch.Tensor) -> torch.Tensor:
    """[N] int64: the slice each output belongs to (built once per stack)."""
    widths = offsets[1:] - offsets[:-1]
    return torch.repeat_interleave(torch.arange(len(widths), device=offsets.device), widths)


def lora_add(
    x: torch.Tensor,
    y: torch.Tensor,
    rows: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scales: torch.Tensor,
    slices: torch.Tensor,
) -> torch.Tensor:
    """`slices`: `slice_of_outputs(offsets)`."""
    x, y = x.contiguous(), y.contiguous()
    num_rows, k = x.shape
    sr, rank, n = a.shape[1], b.shape[1], b.shape[2]
    out = torch.empty_like(y)
    if num_rows == 0:
        return out
    u = torch.empty(num_rows, sr, dtype=x.dtype, device=x.device)
    _shrink[(num_rows, triton.cdiv(sr, BLOCK_J))](
        x, u, rows, a, k, sr, BLOCK_J=BLOCK_J, BLOCK_K=BLOCK_K
    )
    _expand[(num_rows, triton.cdiv(n, BLOCK_N))](
        u, y, out, rows, b, scales, slices, n, sr, rank, BLOCK_N=BLOCK_N
    )
    return out
