"""GGUF blocks kept as stored (models/block_linear.py over models/cpu_kernels/block_linear.cpp).

Oracles: the `gguf` package's dequantisation (the unpacked rows must equal it bit for bit, on
hand-made blocks and on the default model's own tensors; tests/ggml_blocks.py decodes the hand-
made ones element by element too), the dense kernel (linear.cpp) over the gguf-dequantised
weights in the activations' dtype, which is what `--dequantize` runs (the block kernel runs its
per-lane order: bitwise equal), and the same row computed alone (batch invariance: the bits must
match whatever M and the other rows are)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from models import cpu_kernels
from models.block_linear import BlockEmbedding, BlockLinear, BlockWeight
from models.gguf.file import open_gguf
from tests.devices import default_model_here
from tests.ggml_blocks import hand_dequantise

pytestmark = pytest.mark.cpu_kernels  # skipped off the CPU (tests/conftest.py)

TYPES = [QT.Q4_0, QT.Q4_1, QT.Q8_0]  # block_linear.cpp's own (test_kquant_linear.py: the rest)
DTYPES = [torch.float32, torch.bfloat16]
BLOCK_BYTES = {QT.Q4_0: 18, QT.Q4_1: 20, QT.Q8_0: 34}
SCALE_BYTES = {QT.Q4_0: 2, QT.Q4_1: 4, QT.Q8_0: 2}  # d (and m) at the start of a block


def hand_made_blocks(qtype: QT, rows: int, k: int, seed: int) -> np.ndarray:
    """Random quant bytes; d (and m) random finite fp16 of every magnitude, subnormals included."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, k // 32, BLOCK_BYTES[qtype]), dtype=np.uint8)
    scales = rng.standard_normal((rows, k // 32, SCALE_BYTES[qtype] // 2)) * 10.0 ** rng.integers(
        -7, 4, (rows, k // 32, 1)
    )
    raw[..., : SCALE_BYTES[qtype]] = scales.astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def packed(raw: np.ndarray, qtype: QT, k: int) -> BlockWeight:
    return BlockWeight.pack(torch.from_numpy(raw), qtype, k)


def bits(a: np.ndarray | torch.Tensor) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("qtype", TYPES)
def test_unpacked_hand_made_blocks_equal_gguf_dequantisation_bitwise(qtype: QT) -> None:
    raw = hand_made_blocks(qtype, rows=37, k=96, seed=int(qtype))  # 37: a partial last panel
    got = packed(raw, qtype, 96).dequantized().numpy()
    assert np.array_equal(bits(got), bits(dequantize(raw, qtype)))
    assert np.array_equal(bits(got), bits(hand_dequantise(raw, qtype)))


def test_unpacked_default_model_tensors_equal_gguf_dequantisation_bitwise() -> None:
    gguf = open_gguf(default_model_here())
    names = {"token_embd.weight"} | {
        f"blk.{i}.{part}.weight" for i in (0, 29) for part in ("attn_q", "attn_v", "ffn_down")
    }
    infos = [info for info in gguf.infos if info.name in names]
    assert {QT(info.type_id) for info in infos} == {QT.Q4_1, QT.Q8_0}
    for info in infos:
        raw = gguf.blocks(info)
        weight = BlockWeight.pack(raw, QT(info.type_id), info.shape[-1])
        assert info.shape[0] % 16 == 0 and weight.nbytes == raw.numel(), info.name  # file bytes
        got = weight.dequantized().numpy()
        assert np.array_equal(bits(got), bits(dequantize(raw.numpy(), QT(info.type_id)))), info.name


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    view = torch.int32 if a.dtype == torch.float32 else torch.int16
    return a.dtype == b.dtype and torch.equal(a.view(view), b.view(view))


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 2, 5, 8, 9, 64, 130])
def test_block_linear_equals_the_dense_kernel_over_the_dequantised_weights_bitwise(
    qtype, dtype, m
) -> None:
    """The `--dequantize` path: gguf's float32 dequantisation, rounded to the dtype by torch,
    packed for linear.cpp. Both output dtypes, with and without bias; n = 75 leaves a partial
    panel and partial register tiles on both passes."""
    gen = torch.Generator().manual_seed(int(qtype) * 100 + m)
    n, k = 75, 320
    raw = quantize(torch.randn(n, k, generator=gen).numpy(), qtype)
    ext = cpu_kernels.extension()
    dense = ext.pack_linear(torch.from_numpy(dequantize(raw, qtype)).to(dtype).contiguous())
    bias = torch.randn(n, generator=gen).to(dtype)
    x = torch.randn(m, k, generator=gen).to(dtype)
    for b in (None, bias):
        layer = BlockLinear(packed(raw, qtype, k), None if b is None else torch.nn.Parameter(b))
        for float_out in (True, False):
            got = layer.apply(x, float_out=float_out)
            want = ext.linear(x, dense, b, n, float_out)
            assert same_bits(got, want), (b is None, float_out, float((got - want).abs().max()))


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 3])
def test_blocks_with_infinite_or_nan_scales_give_the_dense_kernels_outputs(qtype, m) -> None:
    """A file may hold d = inf or NaN. NaN outputs where the dense kernel has them (a NaN's own
    bits differ between torch's and c10's bf16 rounding, so NaN-ness is compared), the other
    outputs bitwise. The NaN with every payload bit set becomes -0.0 under the integer
    rounding for finite weights: the kernels must hand such blocks to the NaN-aware one."""
    n, k = 40, 96
    raw = hand_made_blocks(qtype, n, k, seed=5).reshape(n, k // 32, BLOCK_BYTES[qtype])
    raw[3, 1, :2] = np.array([np.inf], np.float16).view(np.uint8)
    raw[17, 2, :2] = np.array([0x7FFF], np.uint16).view(np.uint8)  # NaN, full payload
    raw[33, 0, :2] = np.array([-np.inf], np.float16).view(np.uint8)
    raw = raw.reshape(n, -1)
    gen = torch.Generator().manual_seed(m)
    ext = cpu_kernels.extension()
    with np.errstate(invalid="ignore", over="ignore"):
        weights = torch.from_numpy(dequantize(raw, qtype))
    for dtype in DTYPES:
        dense = ext.pack_linear(weights.to(dtype).contiguous())
        x = torch.randn(m, k, generator=gen).to(dtype)
        layer = BlockLinear(packed(raw, qtype, k), None)
        for float_out in (True, False):
            got = layer.apply(x, float_out=float_out)
            want = ext.linear(x, dense, None, n, float_out)
            assert got[:, 17].isnan().all()
            assert torch.equal(got.isnan(), want.isnan()), (dtype, float_out)
            finite = ~want.isnan()
            assert same_bits(got[finite], want[finite]), (dtype, float_out)


# Row counts: 1..8 take the few-rows pass (blocks dequantised in registers; K-quants from 5 rows
# the group pass), more the dequantised scratch; 9, 11, 13, 14, 64 and 130 leave every 6-row tile
# remainder, 130 rows over n = 40 (one group, 3 panels) are split across threads, and 300 rows
# of float32 x at k = 576 fill more than one of the walk's row blocks (512 KiB: 227 rows).
ROW_COUNTS = (2, 3, 5, 7, 8, 9, 11, 13, 14, 64, 130, 300)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [200, 40])
def test_a_block_linear_row_does_not_depend_on_the_other_rows(qtype, dtype, n) -> None:
    gen = torch.Generator().manual_seed(3)
    k = 576
    raw = quantize(torch.randn(n, k, generator=gen).numpy(), qtype)
    bias = torch.nn.Parameter(torch.randn(n, generator=gen).to(dtype), requires_grad=False)
    assert_rows_alone_equal_rows_in_batches(BlockLinear(packed(raw, qtype, k), bias), dtype, gen)


def assert_within_tight_bound(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor) -> None:
    assert ((got - want).abs() <= bound).all(), float(((got - want).abs() / bound).max())
    # the bound is a tight one (0.1% of the outputs' scale), not a blanket tolerance
    assert 0 < float(bound.max()) < 1e-3 * float(want.abs().max())


def assert_rows_alone_equal_rows_in_batches(layer: BlockLinear, dtype, gen) -> None:
    """A random row's output bits, alone and among M - 1 random others, both output dtypes."""
    k = layer.in_features
    # magnitudes spread over 2^±12: the block sums round in float32, so any change in the
    # order of a lane's operations shows in its bits
    scale = torch.exp2(torch.randint(-12, 13, (1, k), generator=gen).float())
    x = (torch.randn(1, k, generator=gen) * scale).to(dtype)
    solo = {out: layer.apply(x, float_out=out)[0] for out in (True, False)}
    for m in ROW_COUNTS:
        others = torch.randn(m, k, generator=gen).to(dtype) * 10
        row = int(torch.randint(m, (1,), generator=gen))
        others[row] = x[0]
        for out, want in solo.items():
            assert torch.equal(layer.apply(others, float_out=out)[row], want), (m, row, out)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 5, 64])
def test_bfloat16_outputs_are_the_float32_outputs_rounded_by_torch(qtype, m) -> None:
    """The kernel rounds acc + bias to bf16 itself (16 lanes at a time): torch's rounding of
    the same float32 sums is the oracle, on both passes (few rows and many)."""
    gen = torch.Generator().manual_seed(11)
    n, k = 75, 256
    raw = quantize(torch.randn(n, k, generator=gen).numpy(), qtype)
    bias = torch.nn.Parameter(torch.randn(n, generator=gen).bfloat16(), requires_grad=False)
    layer = BlockLinear(packed(raw, qtype, k), bias)
    x = torch.randn(m, k, generator=gen).bfloat16()
    full = layer.apply(x, float_out=True)
    assert torch.equal(layer.apply(x, float_out=False), full.to(torch.bfloat16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_block_embedding_rows_are_the_dequantised_rows_in_the_model_dtype(dtype) -> None:
    raw = hand_made_blocks(QT.Q8_0, rows=40, k=64, seed=5)
    embedding = BlockEmbedding(packed(raw, QT.Q8_0, 64), dtype)
    ids = torch.tensor([[3, 39], [0, 3]])
    want = torch.from_numpy(dequantize(raw, QT.Q8_0))[ids].to(dtype)
    assert torch.equal(embedding(ids), want)


def test_rows_of_blocks_that_do_not_hold_k_weights_are_refused() -> None:
    raw = torch.zeros(4, 20, dtype=torch.uint8)  # one Q4_1 block per row: 32 weights, not 64
    with pytest.raises(RuntimeError, match="do not hold 64 weights"):
        BlockWeight.pack(raw, QT.Q4_1, 64)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 2, 5, 8])
def test_activations_in_the_underflow_range_give_the_dense_kernels_bits(qtype, m) -> None:
    """Products and sums below float32's normal range: with bf16 activations on an AVX512-BF16
    CPU the dense kernel's vdpbf16ps reads denormal inputs as zero and flushes denormal sums,
    and the few-rows passes, which run its pairs as two fmas, must do the same (every lane,
    every row count up to a speculative verify's); float32 activations keep denormals on both
    paths. Activations from 2^-149 (bf16 denormals included) to 2^-100, weights around 2^-20:
    most products and partial sums are denormal."""
    gen = torch.Generator().manual_seed(int(qtype) * 10 + m)
    n, k = 75, 320
    raw = quantize((torch.randn(n, k, generator=gen) * 2.0**-20).numpy(), qtype)
    exponents = torch.randint(-149, -100, (m, k), generator=gen).float()
    x32 = torch.randn(m, k, generator=gen).sign() * torch.exp2(exponents)
    x32[:, ::7] = torch.randn(m, k // 7 + 1, generator=gen)[:, : x32[:, ::7].shape[1]] * 1e-37
    ext = cpu_kernels.extension()
    for dtype in DTYPES:
        x = x32.to(dtype)
        assert bool((x != 0).any())
        dense = ext.pack_linear(torch.from_numpy(dequantize(raw, qtype)).to(dtype).contiguous())
        layer = BlockLinear(packed(raw, qtype, k), None)
        got = layer.apply(x, float_out=True)
        want = ext.linear(x, dense, None, n, True)
        assert same_bits(got, want), (dtype, float((got - want).abs().max()))
