"""Integer activations (`--activation-quantization int8 | int16`): linears whose weights are GGUF
Q4_0 / Q4_1 / Q8_0 blocks or `--quantization int8` rows compute integer dot products.

Why: with 4- or 8-bit weights, a batched step is bound by arithmetic, not by bytes; quantising
each activation row to int8 turns 32 multiply-adds per block into one AVX512-VNNI vpdpbusd lane
(AVX2: vpmaddubsw), as llama.cpp computes. The cost is accuracy: activations carry 8 bits, which
changes the default model's greedy answers. int16 (d = amax / 32767 per block: 1.5e-5 of the
block's largest, float-like) keeps them and still multiplies integers (AVX2 vpmaddwd on the
weights widened to int16: models/cpu_kernels/q16_dot.h, q16_avx2.h); the same panels serve both.

Scales: one per row and block of 32 k (llama.cpp's Q8_0 activations), not one per row. GGUF
weights carry a scale per block of 32 anyway, so the float epilogue runs per block whatever the
activations' scale; a per-block scale then costs nothing and keeps an outlier from flattening
the rest of its row (one large channel costs only its own 31 neighbours their resolution).

Contract:
- `Q8Weight.from_blocks(weight)` repacks a `BlockWeight` of `Q8_KINDS` (the same integers and
  fp16 scales) into the kernels' Q8 panels (models/cpu_kernels/q8_linear.h);
  `Q8Weight.from_int8(weight_int8 [N, K], scale [N])` packs weight-only int8 rows (K a multiple
  of 32; float32 scales). `dequantized()` -> float32 [N, K], d * q (+ m) as the file's dequantisation rounds.
  `with_bits(16)`: the same panels under the int16 activations' kind (`act_bits`).
- `Q8Linear(weight, bias)`: `forward(x [..., K]) -> [..., N]` in x's dtype (`apply(x,
  float_out=True)`: float32, the LM head). Each row of x is quantised on its own and the sums
  run in an order fixed by K (q8_linear.h): a row's bits do not depend on the other rows, the
  thread count or the ISA the kernels were built for.
- `int8_dot_product_refusal(device, mode=...)`: why the option (`int8` / `int16`) cannot run
  there (None: it can).
- `quantize_activations(model, bits)` (`quantize_activations_int8(model)`: bits 8): replaces
  every `BlockLinear` of `Q8_KINDS` and every `Int8Linear` (K a multiple of 32) in place;
  returns how many. Other layers keep their path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from gguf import GGMLQuantizationType as QT
from torch import nn

from models import cpu_kernels
from models.block_linear import BlockLinear, BlockWeight
from models.cpu_features import cpu_flags
from models.quantization import Int8Linear

Q8_KINDS: frozenset[QT] = frozenset((QT.Q4_0, QT.Q4_1, QT.Q8_0))
KIND_BASE = 2000  # q8_linear.h's kQ8Activations: a kind is KIND_BASE + the GGML type,
INT8_ROWS = 1008  # or + kInt8Rows: Q8 quants with float32 scales (`--quantization int8` rows)
KIND_BASE_INT16 = 4000  # kQ16Activations: the same panels, int16 activations (> 3008)
_PANEL, _BLOCK = 16, 32
# CPU flags under which the integer path beats float: VNNI, or AVX2's vpmaddubsw (int8);
# AVX2's vpmaddwd (int16: AVX-512 CPUs have AVX2 too).
DOT_FLAGS = {"int8": ("avx512_vnni", "avx_vnni", "avx2"), "int16": ("avx2",)}
INT8_DOT_FLAGS = DOT_FLAGS["int8"]


def _ext():
    ext = cpu_kernels.extension()
    if ext is None:
        raise RuntimeError("int8 activations need tgserve's C++ CPU kernels")
    return ext


def _padded(t: torch.Tensor, rows: int) -> torch.Tensor:
    """t [N, ...] with zero rows up to `rows`."""
    return torch.cat((t, t.new_zeros(rows - t.shape[0], *t.shape[1:]))) if rows > t.shape[0] else t


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """[P, nb, ...] -> uint8 [P, nb, bytes]."""
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], t.shape[1], -1)


@dataclass(frozen=True, eq=False)
class Q8Weight:
    packed: torch.Tensor  # uint8 [ceil(N / 16), K / 32 * block bytes] (q8_linear.h's panels)
    qtype: QT  # the integers' format: Q4_0, Q4_1, or Q8_0 (int8 rows too)
    out_features: int
    in_features: int
    # float32 scales: `--quantization int8` rows (any float32 row scale); a file's blocks keep
    # their fp16 ones (fewer bytes to stream)
    row_scales: bool = False
    act_bits: int = 8  # the activations' integers: 8 or 16 (the same panels)

    @property
    def kind(self) -> int:
        base = KIND_BASE_INT16 if self.act_bits == 16 else KIND_BASE
        return base + (INT8_ROWS if self.row_scales else int(self.qtype))

    def with_bits(self, bits: int) -> Q8Weight:
        """The same panels (shared, not copied) run with `bits`-bit activations (8 or 16)."""
        if bits not in (8, 16):
            raise ValueError(f"activations are 8 or 16 bits, not {bits}")
        return replace(self, act_bits=bits)

    @property
    def _scale_dtype(self) -> torch.dtype:
        return torch.float32 if self.row_scales else torch.float16

    @classmethod
    def pack(
        cls,
        q: torch.Tensor,
        d: torch.Tensor,
        m: torch.Tensor | None,
        qtype: QT,
        row_scales: bool = False,
    ) -> Q8Weight:
        """q [N, K] integers (Q4: the nibbles 0..15; Q8: int8), d / m [N, K / 32] float32: values
        fp16 holds exactly, as a file's (ValueError otherwise), or any with `row_scales` (Q8)."""
        n, k = q.shape
        rows = -(-n // _PANEL) * _PANEL
        nb = k // _BLOCK
        # [P, 16 lanes, nb, 32] -> [P, nb, 16, 32]
        q = _padded(q, rows).reshape(rows // _PANEL, _PANEL, nb, _BLOCK).transpose(1, 2)
        if qtype == QT.Q8_0:  # 8 groups of 4 k, lane-major: [P, nb, g, l, 4]
            quants = q.to(torch.int8).reshape(*q.shape[:3], 8, 4).transpose(2, 3)
        else:  # low nibble: k = 4g + j, high: 16 + 4g + j
            nib = q.to(torch.uint8).reshape(*q.shape[:3], 2, 4, 4)  # [P, nb, l, half, g, j]
            quants = (nib[:, :, :, 0] | (nib[:, :, :, 1] << 4)).transpose(2, 3)
        scale_dtype = torch.float32 if row_scales else torch.float16  # q8_linear.h
        scales = [d] if m is None else [d, m]
        for s in scales:
            if not torch.equal(s.float().to(scale_dtype).float(), s.float()):
                raise ValueError(f"{qtype.name} panels need scales exact in {scale_dtype}")
        parts = [
            _padded(s, rows).reshape(rows // _PANEL, _PANEL, nb).transpose(1, 2) for s in scales
        ]
        blob = torch.cat([_as_bytes(p.to(scale_dtype)) for p in parts] + [_as_bytes(quants)], dim=2)
        return cls(blob.reshape(rows // _PANEL, -1).contiguous(), qtype, n, k, row_scales)

    @classmethod
    def from_blocks(cls, weight: BlockWeight) -> Q8Weight:
        """The integers and scales of a packed BlockWeight (models/cpu_kernels/block_linear.cpp's
        layout: per panel and block, 16 fp16 d (Q4_1: then 16 fp16 m), then the quants as 16
        k-pair steps, lane l's pair at bytes 2l, 2l + 1; Q4: step 2t in the low nibbles of
        bytes [32t, 32t + 32), step 2t + 1 in the high ones)."""
        qtype = weight.qtype
        if qtype not in Q8_KINDS:
            raise ValueError(
                f"int8 activations need Q4_0 / Q4_1 / Q8_0 blocks, not {weight.type_name}"
            )
        n, k = weight.out_features, weight.in_features
        nb, panels = k // _BLOCK, weight.packed.shape[0]
        blocks = weight.packed.reshape(panels, nb, -1)  # [P, nb, 16 * file block bytes]
        has_min = qtype == QT.Q4_1

        def halves(start: int) -> torch.Tensor:  # 16 fp16 scales -> float32 [P, nb, 16]
            return blocks[:, :, start : start + 32].contiguous().view(torch.float16).float()

        d, m = halves(0), halves(32) if has_min else None
        raw = blocks[:, :, 64 if has_min else 32 :]
        if qtype == QT.Q8_0:  # [P, nb, step s, lane, i] -> k = 2s + i
            q = raw.view(torch.int8).reshape(panels, nb, 16, 16, 2).permute(0, 3, 1, 2, 4)
        else:  # [P, nb, t, lane, i]: k = 4t + i (low nibble), 4t + 2 + i (high)
            b = raw.reshape(panels, nb, 8, 16, 2)
            q = torch.stack((b & 0xF, b >> 4), dim=3).permute(0, 4, 1, 2, 3, 5)
        q = q.reshape(panels * _PANEL, k)[:n]

        def rows(s: torch.Tensor) -> torch.Tensor:  # [P, nb, 16] -> [N, nb]
            return s.transpose(1, 2).reshape(panels * _PANEL, nb)[:n]

        return cls.pack(q, rows(d), None if m is None else rows(m), qtype)

    @classmethod
    def from_int8(cls, weight_int8: torch.Tensor, scale: torch.Tensor) -> Q8Weight:
        n, k = weight_int8.shape
        if k % _BLOCK:
            raise ValueError(f"int8 activations need K a multiple of 32, got {k}")
        d = scale.float().reshape(n, 1).expand(n, k // _BLOCK)
        return cls.pack(weight_int8, d, None, QT.Q8_0, row_scales=True)

    @property
    def nbytes(self) -> int:
        return self.packed.numel()

    def parts(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(q [N, K] int32 as the sums use it (Q4_0: nibble - 8), d [N, K / 32], m or None)."""
        panels, nb = self.packed.shape[0], self.in_features // _BLOCK
        blocks = self.packed.reshape(panels, nb, -1)
        scale_dtype = self._scale_dtype
        size = _PANEL * scale_dtype.itemsize  # one panel block's 16 scales
        scale_bytes = 2 * size if self.qtype == QT.Q4_1 else size

        def rows(s: torch.Tensor) -> torch.Tensor:  # bytes [P, nb, size] -> float32 [N, nb]
            s = s.contiguous().view(scale_dtype).float().transpose(1, 2)
            return s.reshape(panels * _PANEL, nb)[: self.out_features]

        d = rows(blocks[:, :, :size])
        m = rows(blocks[:, :, size : 2 * size]) if self.qtype == QT.Q4_1 else None
        raw = blocks[:, :, scale_bytes:]
        if self.qtype == QT.Q8_0:  # [P, nb, g, l, j] -> [P, l, nb, g, j]
            q = raw.view(torch.int8).reshape(panels, nb, 8, 16, 4).permute(0, 3, 1, 2, 4)
        else:  # [P, nb, g, l, j] -> [P, l, nb, half, g, j]
            b = raw.reshape(panels, nb, 4, 16, 4)
            q = torch.stack((b & 0xF, b >> 4), dim=2).permute(0, 4, 1, 2, 3, 5)
            q = q.int() - (8 if self.qtype == QT.Q4_0 else 0)
        q = q.reshape(panels * _PANEL, self.in_features)[: self.out_features].int()
        return q, d, m

    def dequantized(self) -> torch.Tensor:
        """float32 [N, K]: d * q (+ m), each step rounded to float32 as gguf dequantises."""
        q, d, m = self.parts()
        w = q.float().reshape(self.out_features, -1, _BLOCK) * d[..., None]
        if m is not None:
            w = w + m[..., None]
        return w.reshape(self.out_features, self.in_features)


class Q8Linear(nn.Module):
    def __init__(self, weight: Q8Weight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.q8_weight = weight
        self.bias = bias
        self.in_features, self.out_features = weight.in_features, weight.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply(x, float_out=False)

    def apply(self, x: torch.Tensor, float_out: bool) -> torch.Tensor:
        """x [..., K] -> [..., N], float32 when `float_out` (the LM head), else x's dtype."""
        shape = x.shape
        w = self.q8_weight
        bias = None if self.bias is None else self.bias.detach().to(x.dtype).contiguous()
        y = _ext().q8_linear(
            x.reshape(-1, shape[-1]).contiguous(), w.packed, w.kind, w.out_features, bias, float_out
        )
        return y.reshape(*shape[:-1], w.out_features)

    def extra_repr(self) -> str:
        w = self.q8_weight
        act = f"q{w.act_bits}"
        return f"in_features={w.in_features}, out_features={w.out_features}, {act} x {w.qtype.name}"


def int8_dot_product_refusal(
    device: torch.device | str, flags: tuple[str, ...] | None = None, mode: str = "int8"
) -> str | None:
    """Why `--activation-quantization <mode>` (int8 / int16) cannot run on `device` (None: it
    can). `flags`: the CPU's (read from /proc/cpuinfo when None)."""
    device = torch.device(device)
    if device.type != "cpu":
        return f"activation_quantization {mode!r} runs on a CPU only, not on {device.type}"
    flags = cpu_flags() if flags is None else flags
    if not any(flag in flags for flag in DOT_FLAGS[mode]):
        wanted = "AVX512-VNNI, AVX-VNNI or AVX2" if mode == "int8" else "AVX2"
        return (
            f"activation_quantization {mode!r} needs a CPU with {wanted} (integer dot products); "
            "this one has none of them"
        )
    if cpu_kernels.extension() is None:
        return (
            f"activation_quantization {mode!r} needs tgserve's C++ CPU kernels, which did not build"
        )
    return None


def quantize_activations_int8(model: nn.Module) -> int:
    """quantize_activations(model, 8)."""
    return quantize_activations(model, 8)


def quantize_activations(model: nn.Module, bits: int) -> int:
    """Puts a Q8Linear of `bits`-bit activations (8 or 16) in place of every BlockLinear of
    Q8_KINDS and every Int8Linear whose K is a multiple of 32; returns how many. A tied LM head
    gets its own copy of the embedding's integers (the embedding keeps its blocks)."""
    count = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, BlockLinear) and child.block_weight.qtype in Q8_KINDS:
                weight = Q8Weight.from_blocks(child.block_weight)
            elif isinstance(child, Int8Linear) and child.in_features % _BLOCK == 0:
                weight = Q8Weight.from_int8(child.weight_int8, child.scale)
            else:
                continue
            setattr(module, name, Q8Linear(weight.with_bits(bits), child.bias))
            count += 1
    return count
