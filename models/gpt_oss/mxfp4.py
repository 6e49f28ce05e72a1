"""MXFP4 expert tensors, as the released gpt-oss checkpoints store them, dequantised at load.

Format (OCP microscaling FP4, as the files hold it): a projection `P` of E experts with N
output rows and K inputs is `P_blocks` uint8 [E, N, K / 32, 16] and `P_scales` uint8
[E, N, K / 32]. Each block of 32 consecutive inputs of a row is 16 bytes of 4-bit E2M1 codes
(element 2j in byte j's low nibble, element 2j + 1 in its high nibble; code c is
`FP4_VALUES[c]`: sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6) times 2^(scale - 127).

Contract: `dequantize_mxfp4(blocks, scales) -> [..., K]` bfloat16 (exact: every value has at
most two significant bits); `mxfp4_experts(tensors)` replaces every `P_blocks` / `P_scales`
pair of a state dict by `P`: an `Mxfp4Pair` whose `shape` is transformers' [E, K, N] and whose
`dense()` is that tensor (a transposed view), dequantised only then, one projection at a time
as the model loads (a whole dense copy of the experts would double a load's peak memory);
other tensors untouched; ValueError naming the tensor for a pair that does not fit.
`ggml_to_hf_blocks(raw)` reads GGML's MXFP4 blocks (a GGUF's type 39, as llama.cpp's converter
writes them) as those blocks and scales, byte for byte: each block of 32 is 17 bytes, the scale
byte first, then 16 bytes holding element j in byte j's low nibble and element j + 16 in its
high nibble (GGML doubles the code values and halves the scale: the same products).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)  # fmt: skip


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    if blocks.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} ({blocks.dtype}) do not fit scales "
            f"{tuple(scales.shape)}: want uint8 [..., G, 16] and [..., G]"
        )
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    out = torch.empty(*blocks.shape[:-2], blocks.shape[-2] * 32, dtype=torch.bfloat16)
    flat_out = out.view(-1, *out.shape[-1:])  # [rows, K]
    flat_blocks = blocks.reshape(-1, *blocks.shape[-2:])  # [rows, G, 16]
    exponents = scales.reshape(-1, scales.shape[-1]).to(torch.int32) - 127  # [rows, G]
    step = 4096  # rows at a time: the float32 temporaries stay small
    for r in range(0, flat_blocks.shape[0], step):
        b = flat_blocks[r : r + step].long()
        pairs = torch.stack((lut[b & 0x0F], lut[b >> 4]), dim=-1)  # [rows, G, 16, 2]
        values = torch.ldexp(pairs.flatten(-2), exponents[r : r + step, :, None])  # [rows, G, 32]
        flat_out[r : r + step] = values.flatten(-2).to(torch.bfloat16)
    return out


def ggml_to_hf_blocks(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [..., G * 17] GGML MXFP4 rows -> (blocks [..., G, 16], scales [..., G])."""
    if raw.dtype != torch.uint8 or raw.shape[-1] % 17:
        raise ValueError(f"GGML MXFP4 rows {tuple(raw.shape)} ({raw.dtype}) are not 17-byte blocks")
    grouped = raw.reshape(*raw.shape[:-1], -1, 17)
    qs = grouped[..., 1:]
    codes = torch.cat((qs & 0x0F, qs >> 4), dim=-1)  # [..., G, 32] in element order
    return codes[..., 0::2] | (codes[..., 1::2] << 4), grouped[..., 0].contiguous()


@dataclass(frozen=True)
class Mxfp4Pair:
    """One projection's blocks and scales, dequantised only when the model takes it."""

    blocks: torch.Tensor  # [E, N, K / 32, 16] uint8
    scales: torch.Tensor  # [E, N, K / 32] uint8

    @property
    def shape(self) -> tuple[int, ...]:
        """transformers' [E, K, N], what check_checkpoint compares."""
        e, n, groups, _ = self.blocks.shape
        return (e, groups * 32, n)

    def dense(self) -> torch.Tensor:
        return dequantize_mxfp4(self.blocks, self.scales).transpose(-1, -2)  # [E, K, N]


def mxfp4_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | Mxfp4Pair]:
    out: dict[str, torch.Tensor | Mxfp4Pair] = {}
    for name, tensor in tensors.items():
        if name.endswith("_scales") and name.removesuffix("_scales") + "_blocks" in tensors:
            continue  # taken with its blocks
        if not name.endswith("_blocks"):
            out[name] = tensor
            continue
        stem = name.removesuffix("_blocks")
        scales = tensors.get(stem + "_scales")
        if scales is None:
            raise ValueError(f"MXFP4 tensor {name!r} has no {stem + '_scales'!r}")
        if tensor.dim() != 4 or tensor.dtype != torch.uint8 or tensor.shape[:-1] != scales.shape:
            raise ValueError(
                f"MXFP4 tensor {name!r} {tuple(tensor.shape)} ({tensor.dtype}) does not fit "
                f"its scales {tuple(scales.shape)}: want uint8 [E, N, G, 16] and [E, N, G]"
            )
        out[stem] = Mxfp4Pair(tensor, scales)
    return out
