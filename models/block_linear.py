"""GGUF block-quantised weights kept as stored: linear layers and embeddings over them.

Why: at batch 1 on a CPU the bytes streamed per token decide the speed; a Q4_1 matrix is 5 bits
per weight where bf16 is 16. The blocks stay in memory as the file stores them (repacked into
16-row panels, the same bytes: models/cpu_kernels/block_linear.cpp) and the C++ kernel
dequantises them on the fly, activations in the model's dtype, sums in float32.

Contract:
- `STORED_TYPES`: the GGML types kept as blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
  Q6_K; models/cpu_kernels/kquant_linear.cpp has the last five); others are dequantised.
- `BlockWeight.pack(raw, qtype, in_features)`: raw [N, row bytes] uint8 as in the file -> the
  packed weight (needs the C++ extension); `rows(ids)` -> float32 [T, K], bitwise equal to
  `gguf.quants.dequantize` of those rows; `dequantized()` all rows (the reference).
- `BlockWeight.pack` also asks `q4_1_constants_exact(raw)` of a Q4_1 weight: when every block's
  constant terms are exact float32 values (real quantisers' scales are), `type_id` is
  kernels.h's kQ4_1Exact and the float32 few-rows pass skips its per-block check (same bits).
- `BlockWeight.pack_parts([(raw, qtype), ...], in_features)`: row segments stacked into one
  weight (a fused q/k/v or gate/up layer); parts of different types (llama.cpp's Q4_K_M puts
  attn_v in Q6_K beside Q4_K q / k) must all be `MIXABLE_TYPES` and give a mixed weight
  (`qtype` None, `parts` their (type, rows); models/cpu_kernels/mixed_blocks.cpp): each column
  computed as its part's type computes it, bytes the file's plus a 64-byte header (and, for a
  part whose rows are not a multiple of 16, its last panel's zero rows). ValueError otherwise.
- `BlockLinear(weight, bias)`: `forward(x [..., K]) -> [..., N]` in x's dtype (float32 or
  bfloat16), y = x @ W^T (+ bias) with W the dequantised weight rounded to x's dtype,
  accumulated in float32 in linear.cpp's order (fixed by K alone: a row's values do not depend
  on the other rows, issue #14): bitwise what the dequantising path (`--dequantize`) computes.
- `BlockEmbedding(weight, dtype)`: `forward(ids) -> [..., K]` the dequantised rows rounded to
  `dtype`, as the dequantising loader's embedding table holds them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import nn

from models import cpu_kernels

STORED_TYPES: frozenset[GGMLQuantizationType] = frozenset(
    GGMLQuantizationType[name]
    for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
)

# The types a mixed weight's parts may have (kquant_linear.cpp's), and kernels.h's kMixedBlocks.
MIXABLE_TYPES: frozenset[GGMLQuantizationType] = frozenset(
    GGMLQuantizationType[name] for name in ("Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
)
_MIXED_ID = 1000
# kernels.h's kQ4_1Exact: a Q4_1 weight whose every block's constant terms m - 2^15 d and
# m - 2^11 d are finite float32 values (`q4_1_constants_exact`): its few-rows float32 pass
# skips the per-block check (models/cpu_kernels/mantissa_weights.h; the same bits either way).
_Q4_1_EXACT_ID = 1001
_MAX_PARTS = 7


def _ext():
    ext = cpu_kernels.extension()
    if ext is None:
        raise RuntimeError(
            "GGUF blocks as stored need tgserve's C++ CPU kernels (pass --dequantize)"
        )
    return ext


@dataclass(frozen=True, eq=False)
class BlockWeight:
    packed: torch.Tensor  # uint8 [ceil(N / 16), 16 * the file's row bytes]; mixed: [1, bytes]
    qtype: GGMLQuantizationType | None  # None: parts of different types
    out_features: int  # N
    in_features: int  # K
    parts: tuple[tuple[GGMLQuantizationType, int], ...] = ()  # mixed: (type, rows) in row order
    constants_exact: bool = False  # Q4_1: q4_1_constants_exact(raw) held when packed

    @classmethod
    def pack(cls, raw: torch.Tensor, qtype: GGMLQuantizationType, in_features: int) -> BlockWeight:
        packed = _ext().pack_blocks(raw.contiguous(), int(qtype), in_features)
        exact = qtype == GGMLQuantizationType.Q4_1 and q4_1_constants_exact(raw)
        return cls(packed, qtype, raw.shape[0], in_features, constants_exact=exact)

    @classmethod
    def pack_parts(
        cls, parts: list[tuple[torch.Tensor, GGMLQuantizationType]], in_features: int
    ) -> BlockWeight:
        types = [qtype for _, qtype in parts]
        if len(set(types)) == 1:  # one part: packed as it is, no concatenated copy
            raw = parts[0][0] if len(parts) == 1 else torch.cat([part for part, _ in parts])
            return cls.pack(raw, types[0], in_features)
        if not set(types) <= MIXABLE_TYPES or len(parts) > _MAX_PARTS:
            names = ", ".join(t.name for t in types)
            raise ValueError(f"parts of types {names} cannot share one layer as stored")
        header = np.zeros(16, dtype=np.int32)  # count, then (type, rows) per part
        header[0] = len(parts)
        header[1 : 1 + 2 * len(parts)] = [v for raw, t in parts for v in (int(t), raw.shape[0])]
        packed = [_ext().pack_blocks(raw.contiguous(), int(t), in_features) for raw, t in parts]
        blob = torch.cat(
            [torch.from_numpy(header.view(np.uint8)), *(p.reshape(-1) for p in packed)]
        )
        rows = tuple((t, raw.shape[0]) for raw, t in parts)
        weight = cls(blob.reshape(1, -1), None, sum(n for _, n in rows), in_features, rows)
        weight.rows(torch.zeros(0, dtype=torch.long))  # the extension checks the layout
        return weight

    @property
    def type_id(self) -> int:
        """The kernels' type code: the GGML type's id, or kMixedBlocks."""
        if self.qtype is None:
            return _MIXED_ID
        return _Q4_1_EXACT_ID if self.constants_exact else int(self.qtype)

    @property
    def type_name(self) -> str:
        if self.qtype is not None:
            return self.qtype.name
        return "+".join(f"{t.name}[{n}]" for t, n in self.parts)

    @property
    def nbytes(self) -> int:
        return self.packed.numel()

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] int64 -> float32 [T, K], the rows as gguf dequantises them."""
        return _ext().block_rows(
            self.packed, self.type_id, self.in_features, self.out_features, ids.contiguous()
        )

    def dequantized(self) -> torch.Tensor:
        return self.rows(torch.arange(self.out_features))


def q4_1_constants_exact(raw: torch.Tensor) -> bool:
    """Whether every Q4_1 block of `raw` ([N, row bytes] as in the file) has finite scales whose
    constant terms m - R d (R = 2^15 and 2^11, mantissa_weights.h) are float32 values exactly.
    d and m are fp16, so R d and m - R d are exact in float64: the test is float32(c) == c."""
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType.Q4_1][1]
    blocks = raw.contiguous().view(torch.uint8).reshape(-1, block_bytes).numpy()
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float64)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        for r in (2.0**15, 2.0**11):
            c = m - r * d
            if not (np.isfinite(c).all() and (c.astype(np.float32) == c).all()):
                return False
    return True


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
            w.type_id,
            w.out_features,
            bias,
            float_out,
        )
        return y.reshape(*shape[:-1], w.out_features)

    def extra_repr(self) -> str:
        w = self.block_weight
        return f"in_features={w.in_features}, out_features={w.out_features}, type={w.type_name}"


class BlockEmbedding(nn.Module):
    def __init__(self, weight: BlockWeight, dtype: torch.dtype) -> None:
        super().__init__()
        self.block_weight = weight
        self.dtype = dtype
        self.num_embeddings, self.embedding_dim = weight.out_features, weight.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.block_weight.rows(ids.reshape(-1).long())  # [T, K] float32
        return rows.to(self.dtype).reshape(*ids.shape, self.embedding_dim)
