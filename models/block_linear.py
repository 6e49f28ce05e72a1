"""GGUF block-quantised weights kept as stored: linear layers and embeddings over them.

Why: at batch 1 on a CPU the bytes streamed per token decide the speed; a Q4_1 matrix is 5 bits
per weight where bf16 is 16. The blocks stay in memory as the file stores them (repacked into
16-row panels, the same bytes: models/cpu_kernels/block_linear.cpp) and the C++ kernel
dequantises them on the fly, activations in the model's dtype, sums in float32.

Contract:
- `STORED_TYPES`: the GGML types kept as blocks (Q4_0, Q4_1, Q8_0); others are dequantised.
- `BlockWeight.pack(raw, qtype, in_features)`: raw [N, row bytes] uint8 as in the file -> the
  packed weight (needs the C++ extension); `rows(ids)` -> float32 [T, K], bitwise equal to
  `gguf.quants.dequantize` of those rows; `dequantized()` all rows (the reference).
- `BlockLinear(weight, bias)`: `forward(x [..., K]) -> [..., N]` in x's dtype (float32 or
  bfloat16), y = x @ W^T (+ bias) with W the dequantised weight rounded to x's dtype,
  accumulated in float32 in linear.cpp's order (fixed by K alone: a row's values do not depend
  on the other rows, issue #14): bitwise what the dequantising path (`--dequantize`) computes.
- `BlockEmbedding(weight, dtype)`: `forward(ids) -> [..., K]` the dequantised rows rounded to
  `dtype`, as the dequantising loader's embedding table holds them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gguf import GGMLQuantizationType
from torch import nn

from models import cpu_kernels

STORED_TYPES: frozenset[GGMLQuantizationType] = frozenset(
    (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0)
)


def _ext():
    ext = cpu_kernels.extension()
    if ext is None:
        raise RuntimeError(
            "GGUF blocks as stored need tgserve's C++ CPU kernels (pass --dequantize)"
        )
    return ext


@dataclass(frozen=True, eq=False)
class BlockWeight:
    packed: torch.Tensor  # uint8 [ceil(N / 16), K / 32 * 16 * block bytes]
    qtype: GGMLQuantizationType
    out_features: int  # N
    in_features: int  # K

    @classmethod
    def pack(cls, raw: torch.Tensor, qtype: GGMLQuantizationType, in_features: int) -> BlockWeight:
        packed = _ext().pack_blocks(raw.contiguous(), int(qtype), in_features)
        return cls(packed, qtype, raw.shape[0], in_features)

    @property
    def nbytes(self) -> int:
        return self.packed.numel()

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] int64 -> float32 [T, K], the rows as gguf dequantises them."""
        return _ext().block_rows(
            self.packed, int(self.qtype), self.in_features, self.out_features, ids.contiguous()
        )

    def dequantized(self) -> torch.Tensor:
        return self.rows(torch.arange(self.out_features))


class BlockLinear(nn.Module):
    def __init__(self, weight: BlockWeight, bias: nn.Parameter | None = None) -> None:
        super().__init__()
        self.block_weight = weight
        self.bias = bias
        self.in_features, self.out_features = weight.in_features, weight.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply(x, float_out=False)

    def apply(self, x: torch.Tensor, float_out: bool) -> torch.Tensor:
        """x [..., K] -> [..., N], float32 when `float_out` (the LM head), else x's dtype."""
        shape = x.shape
        w = self.block_weight
        bias = None if self.bias is None else self.bias.detach().to(x.dtype)
        y = _ext().block_linear(
            x.reshape(-1, shape[-1]).contiguous(),
            w.packed,
            int(w.qtype),
            w.out_features,
            bias,
            float_out,
        )
        return y.reshape(*shape[:-1], w.out_features)

    def extra_repr(self) -> str:
        w = self.block_weight
        return f"in_features={w.in_features}, out_features={w.out_features}, type={w.qtype.name}"


class BlockEmbedding(nn.Module):
    def __init__(self, weight: BlockWeight, dtype: torch.dtype) -> None:
        super().__init__()
        self.block_weight = weight
        self.dtype = dtype
        self.num_embeddings, self.embedding_dim = weight.out_features, weight.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.block_weight.rows(ids.reshape(-1).long())  # [T, K] float32
        return rows.to(self.dtype).reshape(*ids.shape, self.embedding_dim)
