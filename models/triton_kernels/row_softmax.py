"""The sampler's row op: temperature scaling and softmax (or log-softmax) of each row of
logits, in one Triton launch instead of a division, a max, an exp, a sum and a division.

Contract: `row_softmax(logits [R, V] float32, temperature [R] float32 | None, log=False)
-> [R, V] float32`: softmax(logits[r] / temperature[r]) per row (log_softmax with `log`);
None means temperature 1. `logits` is left intact. Same math as `reference` (torch's
`softmax` / `log_softmax` of the scaled rows) up to float32 rounding; -inf logits (masked
tokens) get probability 0 (log-probability -inf).

Reduction order (batch invariance): one program per row; the row is read in blocks of BLOCK
tokens from the first to the last, keeping a running maximum and a running sum of
exp(x - max) rescaled when the maximum grows (each block reduced by one `tl.sum` /
`tl.max` tree): the order depends on V alone, never on R or on the other rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _row_softmax_kernel(
    x_ptr,
    t_ptr,
    out_ptr,
    stride_x,
    stride_out,
    V: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_TEMPERATURE: tl.constexpr,
    LOG: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inv_t = 1.0
    if HAS_TEMPERATURE:
        inv_t = 1.0 / tl.load(t_ptr + row)
    # Pass 1: running max and running sum of exp(x - max), block after block.
    running_max = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    running_sum = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for start in range(0, V, BLOCK):
        mask = start + cols < V
        x = tl.load(x_ptr + row * stride_x + start + cols, mask=mask, other=float("-inf"))
        x = x * inv_t
        new_max = tl.maximum(running_max, tl.max(x, axis=0))
        # A row that is -inf so far keeps a sum of 0 (no exp(-inf - -inf) = nan).
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        running_sum = running_sum * tl.exp(running_max - safe_max) + tl.sum(
            tl.exp(x - safe_max), axis=0
        )
        running_max = new_max
    # Pass 2: write the normalised row.
    for start in range(0, V, BLOCK):
        mask = start + cols < V
        x = tl.load(x_ptr + row * stride_x + start + cols, mask=mask, other=float("-inf"))
        x = x * inv_t
        if LOG:  # noqa: SIM108 (a compile-time branch of the kernel)
            y = x - running_max - tl.log(running_sum)
        else:
            y = tl.exp(x - running_max) / running_sum
        tl.store(out_ptr + row * stride_out + start + cols, y, mask=mask)


def reference(
    logits: torch.Tensor, temperature: torch.Tensor | None = None, log: bool = False
) -> torch.Tensor:
    scaled = logits if temperature is None else logits / temperature.unsqueeze(1)
    return scaled.log_softmax(dim=-1) if log else scaled.softmax(dim=-1)


def row_softmax(
    logits: torch.Tensor, temperature: torch.Tensor | None = None, log: bool = False
) -> torch.Tensor:
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits must be [rows, vocab] float32, got {logits.shape} {logits.dtype}")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    num_rows, vocab = logits.shape
    out = torch.empty_like(logits)
    if num_rows:
        _row_softmax_kernel[(num_rows,)](
            logits,
            logits if temperature is None else temperature.to(torch.float32).contiguous(),
            out,
            logits.stride(0),
            out.stride(0),
            V=vocab,
            BLOCK=min(BLOCK, triton.next_power_of_2(vocab)),
            HAS_TEMPERATURE=temperature is not None,
            LOG=log,
        )
    return out
