"""Encoder-decoder attention (models/encdec/attention.py) on a batch of sequences of mixed shapes:
each sequence's rows equal a float64 reference computed from that sequence alone (scores, bias,
causal mask, softmax written out here), and equal bit for bit the same sequence attended alone,
whether sequences of one shape are batched together (the biased PyTorch path) or every row
goes through the C++ paged kernel (unbiased attention on the CPU)."""

from __future__ import annotations

import pytest
import torch

from models.encdec.attention import SeqSpans, attend_paged, attend_rows, no_bias

HEADS, DIM, BLOCK = 4, 16, 4
# (new query rows, keys): two sequences share (1, 9) and two (3, 3); the rest are alone
SHAPES = [(1, 9), (3, 3), (1, 9), (2, 7), (3, 3), (1, 1), (5, 12)]


def _bias_fn(q_len: int, k_len: int) -> torch.Tensor:
    """A bias that depends on the shape and the positions, as T5's relative bias does."""
    query = torch.arange(k_len - q_len, k_len, dtype=torch.float32)[:, None]
    key = torch.arange(k_len, dtype=torch.float32)[None, :]
    heads = torch.arange(1, HEADS + 1, dtype=torch.float32)[:, None, None]
    return torch.sin(heads * (key - query) / 3.0)  # [H, Q, K]


def _reference(q, k, v, scale, bias, causal) -> torch.Tensor:
    """q [Q, H, D], k, v [L, H, D] in float64 -> [Q, H * D]."""
    q, k, v = q.double(), k.double(), v.double()
    q_len, k_len = q.shape[0], k.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if bias is not None:
        scores = scores + bias.double()
    if causal:
        for i in range(q_len):
            scores[:, i, k_len - q_len + i + 1 :] = float("-inf")
    out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)
    return out.reshape(q_len, -1)


def _paged_case(shapes, seed=0):
    """Each sequence's keys scattered into shuffled blocks of one cache (spare blocks hold
    garbage that must not be read)."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-k_len // BLOCK) for _, k_len in shapes]
    num_blocks = sum(need) + 3
    cache = (
        torch.randn(num_blocks, BLOCK, HEADS, DIM, generator=gen) * 50,
        torch.randn(num_blocks, BLOCK, HEADS, DIM, generator=gen) * 50,
    )
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables, keys, values = [], [], []
    for (_, k_len), blocks in zip(shapes, need, strict=True):
        table = [free.pop() for _ in range(blocks)]
        k = torch.randn(k_len, HEADS, DIM, generator=gen)
        v = torch.randn(k_len, HEADS, DIM, generator=gen)
        for t in range(k_len):
            cache[0][table[t // BLOCK], t % BLOCK] = k[t]
            cache[1][table[t // BLOCK], t % BLOCK] = v[t]
        tables.append(table)
        keys.append(k)
        values.append(v)
    q = torch.randn(sum(n for n, _ in shapes), HEADS, DIM, generator=gen)
    return q, cache, tables, keys, values


def _spans(shapes, tables, cpu_kernel):
    return SeqSpans.build(
        [tables[i] for i in range(len(shapes))],
        [k_len for _, k_len in shapes],
        [n for n, _ in shapes],
        BLOCK,
        "cpu",
        writes=False,
        cpu_kernel=cpu_kernel,
    )


@pytest.mark.parametrize(
    ("biased", "causal", "cpu_kernel"),
    [(True, True, False), (False, False, False), (False, False, True), (False, True, True)],
)
def test_paged_attention_equals_each_sequence_alone_and_the_float64_reference(
    biased, causal, cpu_kernel
):
    bias_fn = _bias_fn if biased else no_bias
    scale = 0.25
    q, cache, tables, keys, values = _paged_case(SHAPES)
    out = attend_paged(q, cache, _spans(SHAPES, tables, cpu_kernel), scale, bias_fn, causal)
    start = 0
    for i, (n, k_len) in enumerate(SHAPES):
        rows = q[start : start + n]
        expected = _reference(rows, keys[i], values[i], scale, bias_fn(n, k_len), causal)
        torch.testing.assert_close(out[start : start + n].double(), expected, atol=2e-5, rtol=0)
        alone = attend_paged(
            rows, cache, _spans([(n, k_len)], [tables[i]], cpu_kernel), scale, bias_fn, causal
        )
        assert torch.equal(out[start : start + n], alone), f"sequence {i} depends on the batch"
        start += n


def test_row_attention_equals_the_float64_reference_and_any_split_of_the_rows():
    """The encoder's attention (rows of one sequence over all its keys, a bias per row) equals
    the float64 reference, and a row's bits do not depend on which rows come with it."""
    gen = torch.Generator().manual_seed(1)
    for n in (1, 5, 8, 19, 40):
        q, k, v = (torch.randn(n, HEADS, DIM, generator=gen) for _ in range(3))
        bias = _bias_fn(n, n)
        out = attend_rows(q, k, v, 0.5, bias)
        expected = _reference(q, k, v, 0.5, bias, causal=False)
        torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=0)
        for first, last in ((0, 1), (n // 3, n), (n // 2, n // 2 + 1), (1, max(2, n - 1))):
            last = min(last, n)
            if first >= last:
                continue
            part = attend_rows(q[first:last], k, v, 0.5, bias[:, first:last])
            assert torch.equal(part, out[first:last]), (n, first, last)
