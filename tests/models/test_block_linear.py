"""GGUF blocks kept as stored (models/block_linear.py over models/cpu_kernels/block_linear.cpp).

Oracles: the `gguf` package's dequantisation (the unpacked rows must equal it bit for bit, on
hand-made blocks and on the default model's own tensors; tests/ggml_blocks.py decodes the hand-
made ones element by element too), a float64 matmul over the dequantised weights (the kernel,
to a bound derived from float32 accumulation), and the same row computed alone (batch
invariance: the bits must match whatever M and the other rows are)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from models.block_linear import BlockEmbedding, BlockLinear, BlockWeight
from models.default_model import default_model_path
from models.gguf.file import open_gguf
from tests.ggml_blocks import hand_dequantise

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
    gguf = open_gguf(default_model_path())
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


def reference_and_bound(x: torch.Tensor, raw: np.ndarray, qtype: QT, k: int):
    """float64 x @ W^T over gguf's dequantised W, and the float32-accumulation error bound.

    The kernel sums d * (sum of x q over the block) (+ m * (sum of x over the block)) block by
    block, each sum in float32: every term's error is at most (k + 4) u times the magnitudes
    summed, B = sum_k |x_k| (|d q_k| + |m|), u = 2^-24; bf16 activations are exact in float64."""
    w = torch.from_numpy(dequantize(raw, qtype)).double()
    blocks = raw.reshape(raw.shape[0], k // 32, -1)
    d = torch.from_numpy(blocks[..., :2].copy().view(np.float16).astype(np.float64))  # [N, nb, 1]
    m = torch.zeros_like(d)
    if qtype == QT.Q4_1:
        m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16).astype(np.float64))
    dq = (w.reshape(w.shape[0], k // 32, 32) - m).abs()  # |d q|
    mag = (dq + m.abs()).reshape(w.shape[0], k)  # [N, K]
    xd = x.double()
    return xd @ w.T, (k + 4) * 2.0**-24 * (xd.abs() @ mag.T)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_block_linear_equals_a_float64_matmul_of_the_dequantised_weights(qtype, dtype) -> None:
    gen = torch.Generator().manual_seed(int(qtype))
    n, k = 53, 160
    raw = quantize(torch.randn(n, k, generator=gen).numpy(), qtype)
    layer = BlockLinear(packed(raw, qtype, k))
    x = torch.randn(13, k, generator=gen).to(dtype)
    want, bound = reference_and_bound(x, raw, qtype, k)
    assert_within_tight_bound(layer.apply(x, float_out=True).double(), want, bound)


# Row counts: 1..8 take the few-rows pass (blocks unpacked in registers), more the unpacked-panel
# scratch; 9 and 13 and 130 leave every 4-row tile remainder, 130 rows over n = 40 (one group
# of 3 panels) are split in row chunks across threads.
ROW_COUNTS = (2, 3, 5, 7, 8, 9, 13, 64, 130)


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
