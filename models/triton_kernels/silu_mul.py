"""SiLU(gate) * up over the fused gate_up projection, in one Triton launch.

Contract: `silu_mul(gate_up [T, 2I]) -> [T, I]` in gate_up's dtype, gate = gate_up[:, :I],
up = gate_up[:, I:]; same math as models/layers.py `GatedMLP` (`reference`): silu in float32
as x / (1 + exp(-x)) (models/pointwise.py) rounded to the dtype, then times up, rounded again.

Nothing is reduced: program (t, b) computes columns [b * BLOCK, (b + 1) * BLOCK) of row t; an
element depends on its own gate and up values only (no tail code path: every element goes
through the same masked block code).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from models import pointwise

BLOCK = 1024


@triton.jit
def _silu_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_out, INNER: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INNER
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + INNER + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    out = (silu.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)


def reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
    return pointwise.silu(gate) * up


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    width = gate_up.shape[-1]
    if width % 2:
        raise ValueError(f"gate_up must hold gate and up side by side; got width {width}")
    rows = gate_up.reshape(-1, width)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    inner = width // 2
    out = torch.empty(rows.shape[0], inner, dtype=gate_up.dtype, device=gate_up.device)
    if rows.shape[0]:
        block = min(BLOCK, triton.next_power_of_2(inner))
        grid = (rows.shape[0], triton.cdiv(inner, block))
        _silu_mul_kernel[grid](rows, out, rows.stride(0), out.stride(0), INNER=inner, BLOCK=block)
    return out.view(*gate_up.shape[:-1], inner)
