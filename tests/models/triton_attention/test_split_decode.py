"""The split decode attention (models/triton_attention/split_decode.py) equals the float64
reference for decode rows whose keys fill from one to more than DECODE_SPLITS key tiles (so
splits are empty, one tile, or several), with and without a sliding window, GQA ratios 1/3/8,
head dims 64/80/128, float32 and bfloat16; a row's bits depend on its own length only; and the
backend sends only decode-only steps of a few rows there, the same in eager and captured steps.
On CPU the kernels run in Triton's interpreter (see conftest.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from models.attention import reference_attention
from models.triton_attention.backend import TritonAttentionBackend
from models.triton_attention.paged_attention import triton_paged_attention
from models.triton_attention.tile_plan import DECODE_SPLITS, SPLIT_MAX_ROWS, decode_splits
from models.triton_attention.tile_step import KEY_TILE
from tests.models.triton_attention.test_paged_attention import KV_HEADS, Step, make_step

# contexts (the new token included): one key; a tile's edge; splits of one tile; more tiles
# than splits (two per split, the last ones short)
LENGTHS = [1, 64, 65, 300, DECODE_SPLITS * KEY_TILE + 70]


def _split(step: Step, scale: float) -> torch.Tensor:
    q = torch.cat(step.q)
    plan = step.meta.tile_plan(q.shape[1] // KV_HEADS)
    plan = dataclasses.replace(plan, decode_splits=DECODE_SPLITS)
    return triton_paged_attention(q, *step.cache, plan, scale)


def _reference(step: Step, scale: float, window: int | None) -> torch.Tensor:
    return torch.cat(
        [
            reference_attention(q.cpu().double(), k.cpu(), v.cpu(), scale, window)
            for q, k, v in zip(step.q, step.k, step.v, strict=True)
        ]
    )


@pytest.mark.parametrize(
    "block_size,group,head_dim,window,dtype",
    [
        (16, 1, 64, None, torch.float32),
        (16, 3, 80, 100, torch.float32),
        (32, 8, 128, None, torch.bfloat16),
        (16, 4, 128, 20, torch.bfloat16),
    ],
)
def test_decode_rows_equal_the_float64_reference(
    triton_kernels, block_size, group, head_dim, window, dtype
) -> None:
    cases = [(n - 1, 1) for n in LENGTHS]
    step = make_step(cases, group * KV_HEADS, head_dim, block_size, window, dtype, triton_kernels)
    scale = head_dim**-0.5
    out = _split(step, scale)
    assert out.dtype == dtype and not out.isnan().any()
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    want = _reference(step, scale, window)
    torch.testing.assert_close(out.cpu().double(), want.double(), atol=tol, rtol=tol)


def test_a_rows_bits_depend_on_its_own_length_only(triton_kernels) -> None:
    """Row 0 (a 300-token context) alone and beside other decode rows: the same bits."""
    num_heads, dim, bs, dt = 3 * KV_HEADS, 64, 16, torch.float32
    full = make_step([(299, 1), (64, 1), (5, 1)], num_heads, dim, bs, None, dt, triton_kernels)
    alone = make_step(
        [(299, 1)],
        num_heads,
        dim,
        bs,
        None,
        dt,
        triton_kernels,
        cache=full.cache,
        tables=full.meta.block_tables[:1].tolist(),
    )
    alone.q[0] = full.q[0]
    together = _split(full, dim**-0.5)[:1]
    assert torch.equal(together, _split(alone, dim**-0.5))


def test_only_decode_only_steps_of_a_few_rows_split() -> None:
    for rows in range(1, SPLIT_MAX_ROWS + 1):
        assert decode_splits([1] * rows, True) == DECODE_SPLITS
    assert decode_splits([1] * (SPLIT_MAX_ROWS + 1), True) == 0  # the one pass fills the GPU
    assert decode_splits([1, 5], True) == 0  # a mixed step
    assert decode_splits([1], False) == 0  # --batch-invariant
    assert decode_splits([], True) == 0


@pytest.mark.parametrize("split", [True, False])
def test_eager_and_captured_decode_steps_follow_the_same_rule(split) -> None:
    backend = TritonAttentionBackend(4, 16, None, torch.device("cpu"), split)
    want = DECODE_SPLITS if split else 0
    eager = backend.build([[0], [1]], [5, 9], [1, 1])
    assert eager.tile_plan(4).decode_splits == want
    assert backend.build([[0], [1]], [5, 9], [1, 4]).tile_plan(4).decode_splits == 0
    buffers = backend.decode_buffers(SPLIT_MAX_ROWS + 4, 4, 99)
    assert buffers.build_for_capture(2).meta.tile_plan(4).decode_splits == want
    wide = buffers.build_for_capture(SPLIT_MAX_ROWS + 1)
    assert wide.meta.tile_plan(4).decode_splits == 0
