"""The compiled fast path: every decoder block's dense halves (`dense_in`: norm, qkv,
rotary; `dense_out`: out projection, residuals, norm, MLP) run through torch.compile, which
fuses their elementwise ops into a few kernels. The paged attention between them stays eager.

Switched on in one place (`compile_dense_halves`, called by the engine factory when
EngineConfig.compile is set) and tested against the eager blocks it wraps. One compiled
function per half serves all layers: parameters are graph inputs, and shapes are dynamic in
the number of tokens, so new batch sizes do not recompile.

Outside the batch-invariance guarantee (issue #14): inductor generates its own kernels per
graph, and a one-token step gets a graph of its own (sizes 0 and 1 are always specialised),
so a request's bits can differ between running alone and batched. Seen here: of five mixed
greedy and seeded bf16 requests through this path, one's tokens or logprobs differed from its
solo run. Opt-in (EngineConfig.compile), off by default; the default paths keep the guarantee.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from models.layers import DecoderBlock


def compile_dense_halves(model: nn.Module) -> int:
    """Replaces dense_in / dense_out of every DecoderBlock; returns how many were wrapped."""
    blocks = [m for m in model.modules() if isinstance(m, DecoderBlock)]
    if not blocks:
        return 0
    cls = type(blocks[0])
    dense_in = torch.compile(cls.dense_in, dynamic=True)
    dense_out = torch.compile(cls.dense_out, dynamic=True)
    for block in blocks:
        # Instance attributes shadow the methods; the eager ones stay on the class.
        block.dense_in = functools.partial(dense_in, block)
        block.dense_out = functools.partial(dense_out, block)
    return len(blocks)
