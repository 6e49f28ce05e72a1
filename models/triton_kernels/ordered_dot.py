"""The tile product of the batch-invariant Triton kernels, in an order that does not depend on
where a row sits in its tile, compiled or interpreted.

Contract: `ordered_dot(a [M, K], b [K, N], PRECISION, INTERPRETED) -> [M, N]` float32, the sum
over k of a[m, k] * b[k, n]. Compiled (INTERPRETED False) it is `tl.dot` at PRECISION: one MMA
sequence per tile whose order along K is the same for every row of the tile. Interpreted
(Triton's CPU interpreter, TRITON_INTERPRET=1) it is NOT `tl.dot`, which the interpreter hands
to numpy's matmul and so to the host's BLAS: OpenBLAS's AVX2 (Haswell / Zen) sgemm computes a
16-row tile as micro-tiles of 6 rows plus a remainder kernel that sums K in another order, so a
row's last bits depended on its position in the tile (its position mod 6, and whether it fell
in the last 4 rows), that is on what else the batch held (the AVX-512 kernel's 16-row
micro-tiles hid it). Interpreted, the products are widened to float32 (exact for bfloat16 and
float16 inputs; the interpreter's own low-precision dot reads raw bits), formed elementwise and
summed by numpy along K for every (m, n) alike: the order is fixed by the shapes alone (K, N),
whatever M, the row's place or the host's ISA.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def ordered_dot(a, b, PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):
    if INTERPRETED:  # [M, K, 1] * [1, K, N] summed over K: no BLAS, no position in a tile
        return tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    else:
        return tl.dot(a, b, input_precision=PRECISION)
