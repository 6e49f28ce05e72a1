"""Drawing one token per row from a categorical distribution by inverting its CDF.

Contract: `sample_inverse_cdf(probs [R, V], uniform [R, 1]) -> [R]` returns, for each row, the
token i with `cdf[i - 1] <= u * total < cdf[i]` (cdf over the row's probabilities,
`total` their sum, so rows need not be normalised): token i is drawn with probability
`probs[i] / total` (up to float32 rounding of block sums, ~1e-7 of a block's mass), and
never a token of probability 0. One uniform number per row is all the
randomness a row consumes, so a seeded row only needs its own generator for that number.

Why blocks: a full-vocabulary prefix sum is a sequential scan, slow on CPU (and in float64 a
copy of the whole batch). Summing fixed blocks of `block` tokens is a vectorised float32
reduction; the block sums are accumulated in float64, and only the one block that holds the
answer is then scanned. Each row is reduced on its own, so a row's
draw is the same whatever else is in the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sample_inverse_cdf(
    probs: torch.Tensor, uniform: torch.Tensor, block: int = 256
) -> torch.Tensor:
    num_rows, vocab = probs.shape
    num_blocks = -(-vocab // block)
    if num_blocks * block != vocab:
        probs = F.pad(probs, (0, num_blocks * block - vocab))  # zeros are never drawn
    blocks = probs.view(num_rows, num_blocks, block)
    block_cdf = blocks.sum(dim=-1).to(torch.float64).cumsum(dim=-1)  # [R, num_blocks]
    total = block_cdf[:, -1:].contiguous()  # [R, 1]
    target = uniform.to(torch.float64) * total  # [R, 1], in [0, total)
    b = _first_above(block_cdf, target)  # [R, 1] the block holding the target
    before = torch.where(b > 0, block_cdf.gather(1, (b - 1).clamp(min=0)), 0.0)  # [R, 1]
    inner = blocks[torch.arange(num_rows, device=probs.device), b.squeeze(1)]  # [R, block]
    inner_cdf = before + inner.to(torch.float64).cumsum(dim=-1)  # [R, block]
    i = _first_above(inner_cdf, target)
    return (b * block + i).squeeze(1)


def _first_above(cdf: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[R, 1] first index with cdf > target; where rounding puts the target at or past the end,
    the first index reaching the end instead (its increment, hence probability, is > 0)."""
    above = torch.searchsorted(cdf, target, right=True)
    end = torch.searchsorted(cdf, cdf[:, -1:].contiguous(), right=False)
    return torch.minimum(above, end)
