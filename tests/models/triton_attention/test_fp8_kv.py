"""fp8 (e4m3) K/V in the Triton paged kernels (models/kv_fp8.py, `--kv-cache-dtype fp8`):
- the writer's rows are the layout's statement: the scale's bytes are max|x| / 448 in float32
  and every value is the e4m3 number nearest x * 448 / max|x| (ties to an even significand),
  found here by searching all 254 finite e4m3 numbers, not by a cast; the Triton write puts
  those bytes at the slots the PyTorch write does and skips padding rows;
- both kernels (one pass over a mixed step, the split decode) equal the float64 attention
  over the DEQUANTISED cache as tightly as over a float cache, and the float cache's within
  the bound e4m3's 3-bit significand gives (per element |dx| <= 2^-4 |x| + 2^-10 s);
- a row's bits do not depend on the rest of the step;
- the model's layers through the Triton path over an fp8 cache store layer 0's K/V as the
  writer quantises the float path's, and a sequence's logits are the same alone or batched.
On CPU the kernels run in Triton's interpreter (see conftest.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from models.attention import reference_attention, write_kv
from models.kv_fp8 import FP8_DTYPE, dequantize_fp8_rows, quantize_fp8_rows, row_parts
from models.triton_attention.paged_attention import triton_paged_attention
from models.triton_attention.reference import reference_paged_attention
from models.triton_attention.tile_plan import DECODE_SPLITS
from tests.models.triton_attention.test_paged_attention import (
    KV_HEADS,
    MIXED,
    NUM_BLOCKS,
    Step,
    make_step,
)


def _nearest_e4m3(y: torch.Tensor) -> torch.Tensor:
    """y [N] float64 (|y| <= 448) -> the nearest finite e4m3 number, ties to the even code."""
    codes = torch.arange(256, dtype=torch.uint8)
    values = codes.view(FP8_DTYPE).double()
    finite = ~values.isnan()
    codes, values = codes[finite], values[finite]
    dist = (y[:, None] - values[None, :]).abs()
    tie = dist == dist.min(dim=1, keepdim=True).values
    even = (codes % 2 == 0)[None, :]
    return values[(tie.int() * 2 + (tie & even).int()).argmax(dim=1)]


def test_rows_are_the_layouts_statement() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 2, 32, generator=gen) * torch.logspace(-3, 3, 6).view(6, 1, 1)
    x[0, 0] = 0.0  # an all-zero row
    x[1, 1, 5] = 1e4  # one outlier: the rest of its row falls to e4m3's subnormals or zero
    rows = quantize_fp8_rows(x)
    assert rows.shape == (6, 2, 36) and rows.dtype == torch.uint8
    values, scales = row_parts(rows)
    amax = x.abs().amax(dim=-1, keepdim=True)
    assert torch.equal(scales, amax / 448)  # float32 division, bytes compared as floats
    scaled = torch.where(amax > 0, x * (448 / amax), torch.zeros_like(x))  # float32
    want = _nearest_e4m3(scaled.double().flatten()).view_as(x)
    assert torch.equal(values.double(), want)
    assert torch.equal(values[0, 0].double(), torch.zeros(32, dtype=torch.float64))
    # the dequantised row within e4m3's rounding of x: 2^-4 relative, 2^-10 s below 2^-6 s
    err = (dequantize_fp8_rows(rows) - x.double()).abs()
    assert (err <= x.double().abs() * (1 / 16 + 1e-6) + scales.double() / 1024).all()


def test_the_triton_write_stores_the_rows_at_their_slots(triton_kernels) -> None:
    from models.triton_attention.kv_write import triton_write_kv

    device, bs, dim = triton_kernels, 16, 64
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(5, (4 + 2 + 2) * dim, generator=gen)  # k, v: views of a wider row
    k, v = qkv[:, 4 * dim : 6 * dim].view(5, 2, dim), qkv[:, 6 * dim :].view(5, 2, dim)
    slots = torch.tensor([37, -1, 3, 150, 16])
    shape = (12, bs, 2, dim + 4)
    before = torch.randint(0, 255, shape, dtype=torch.uint8, generator=gen)
    got = tuple(before.clone().to(device) for _ in range(2))
    triton_write_kv(*got, k.to(device), v.to(device), slots.to(device))
    by_torch = tuple(before.clone() for _ in range(2))
    keep = slots >= 0
    write_kv(by_torch, k[keep], v[keep], slots[keep])  # the PyTorch paths' write
    for cache, x, ref in zip(got, (k, v), by_torch, strict=True):
        flat = cache.cpu().view(-1, 2, dim + 4)
        want = before.clone().view(-1, 2, dim + 4)
        want[slots[keep]] = quantize_fp8_rows(x[keep])
        assert torch.equal(flat, want)
        assert torch.equal(flat, ref.view(-1, 2, dim + 4))


def _fp8_step(cases, group, head_dim, block_size, window, dtype, device, **kw) -> Step:
    """make_step over an fp8 cache whose every byte starts as 0xFF (NaN values and scales),
    so a slot read outside a sequence's context would poison the output."""
    if "cache" not in kw:
        shape = (NUM_BLOCKS, block_size, KV_HEADS, head_dim + 4)
        kw["cache"] = tuple(torch.full(shape, 255, dtype=torch.uint8, device=device) for _ in "kv")
    return make_step(cases, group * KV_HEADS, head_dim, block_size, window, dtype, device, **kw)


def _dequantised(step: Step, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence i's whole context as the cache holds it, dequantised: float64 [n, KVH, D]."""
    n, bs = step.k[i].shape[0], step.meta.block_size
    table = step.meta.block_tables[i].cpu()
    pos = torch.arange(n)
    slots = table[pos // bs] * bs + pos % bs
    rows = step.cache[0].shape[-1]
    return tuple(dequantize_fp8_rows(c.cpu().view(-1, KV_HEADS, rows)[slots]) for c in step.cache)


def _run(step: Step, splits: int = 0) -> torch.Tensor:
    q = torch.cat(step.q)
    plan = step.meta.tile_plan(q.shape[1] // KV_HEADS)
    if splits:
        plan = dataclasses.replace(plan, decode_splits=splits)
    return triton_paged_attention(q, *step.cache, plan, q.shape[2] ** -0.5)


def _float_bound(step: Step) -> torch.Tensor:
    """Per output element, how far attention over e4m3 K/V may be from that over the float
    K/V: scores move by at most d = scale * max_j sum |q| (2^-4 |k_j| + 2^-10 s_j), so the
    weights by at most a factor e^(2d) each (their L1 change <= e^(2d) - 1), and each V entry
    by at most 2^-4 |v| + 2^-10 s: |dO| <= (e^(2d) - 1) max|v| + max|dv|."""
    out = []
    for q, k, v in zip(step.q, step.k, step.v, strict=True):
        scale = q.shape[2] ** -0.5
        k, v, q = k.double().cpu(), v.double().cpu(), q.double().cpu()
        dk = k.abs() / 16 + k.abs().amax(-1, keepdim=True) / 448 / 1024  # [n, KVH, D]
        dv = v.abs() / 16 + v.abs().amax(-1, keepdim=True) / 448 / 1024
        group = q.shape[1] // KV_HEADS
        qa = q.abs().view(q.shape[0], KV_HEADS, group, -1)
        d = torch.einsum("tkgd,nkd->tkgn", qa, dk).amax(-1) * scale  # [t, KVH, G]
        weights = torch.expm1(2 * d).view(q.shape[0], -1, 1)  # [t, H, 1]
        vmax = v.abs().amax(0).repeat_interleave(group, 0)  # [H, D]
        out.append(weights * vmax + dv.amax(0).repeat_interleave(group, 0))
    return torch.cat(out)


@pytest.mark.parametrize(
    "block_size,group,head_dim,window,dtype,splits",
    [
        (16, 3, 64, 20, torch.float32, 0),
        (32, 8, 128, None, torch.bfloat16, 0),
        (16, 4, 64, None, torch.float32, DECODE_SPLITS),
    ],
)
def test_kernels_equal_the_float64_attention_over_the_dequantised_cache(
    triton_kernels, block_size, group, head_dim, window, dtype, splits
) -> None:
    cases = [(n, 1) for n in (0, 63, 299)] if splits else MIXED
    step = _fp8_step(cases, group, head_dim, block_size, window, dtype, triton_kernels)
    scale = head_dim**-0.5
    out = _run(step, splits).cpu().double()
    assert not out.isnan().any()
    deq = [_dequantised(step, i) for i in range(len(cases))]
    want = torch.cat(
        [
            reference_attention(q.cpu().double(), k, v, scale, window)
            for q, (k, v) in zip(step.q, deq, strict=True)
        ]
    )
    # as tight as over a float cache (test_paged_attention.py): float32 sums; bfloat16 rounds
    # p * v_scale before the product and the output once
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, want, atol=tol, rtol=tol)
    if dtype == torch.float32:  # the float K/V: within e4m3's rounding, and not equal to it
        exact = torch.cat(
            [
                reference_attention(q.cpu().double(), k.cpu(), v.cpu(), scale, window)
                for q, k, v in zip(step.q, step.k, step.v, strict=True)
            ]
        )
        assert ((out - exact).abs() <= _float_bound(step) + 1e-5).all()
        assert not torch.allclose(out, exact, atol=1e-4, rtol=0)
    if not splits:  # the PyTorch statement of the kernel (captured-step checks use it)
        plan = step.meta.tile_plan(group)
        ref = reference_paged_attention(torch.cat(step.q), *step.cache, plan, scale)
        torch.testing.assert_close(ref.cpu().double(), out, atol=tol, rtol=tol)


def test_a_rows_bits_do_not_depend_on_the_rest_of_the_step(triton_kernels) -> None:
    """Sequence 0's last row (a 130-token context) in a mixed step, and alone: the same bits
    (the split decode's own-length rule is the float cache's, test_split_decode.py)."""
    dim, bs, dt = 64, 16, torch.float32
    cases = [(120, 10), (0, 5), (30, 1)]
    full = _fp8_step(cases, 3, dim, bs, 20, dt, triton_kernels)
    tables = full.meta.block_tables[:1].tolist()
    alone = _fp8_step(
        [(129, 1)], 3, dim, bs, 20, dt, triton_kernels, cache=full.cache, tables=tables
    )
    alone.q[0] = full.q[0][-1:]
    together = _run(full)[full.q[0].shape[0] - 1 : full.q[0].shape[0]]
    assert torch.equal(together, _run(alone))
