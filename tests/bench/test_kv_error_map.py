"""bench.kv_error_map's pieces against independent statements: the layer grammar against
hand-written sets, its generic B-bit rounding at B = 8 against models/kv_quant's int8 rows (a
float32 writer and a float64 one must agree to within one step of a row), more bits or
kept positions leaving less error, and a key offset (`kmu`) rounding k - mu as the int8 rows
do, with less error than plain rows where the keys share a large component."""

from __future__ import annotations

import torch

from bench.kv_error_map import layer_set, rounded, rounding
from models.kv_quant import dequantize_rows, quantize_rows


def test_layer_grammar():
    assert layer_set("all", 4) == {0, 1, 2, 3}
    assert layer_set("none", 4) == set()
    assert layer_set("1-2", 4) == {1, 2}
    assert layer_set("0+3", 4) == {0, 3}
    assert layer_set("~1-2", 4) == {0, 3}
    assert layer_set("~2", 4) == {0, 1, 3}


def test_eight_bits_are_the_int8_rows_and_sixteen_are_finer():
    x = torch.randn(40, 3, 64, generator=torch.Generator().manual_seed(0))
    step = quantize_rows(x)[..., 64:].contiguous().view(torch.float32)  # [40, 3, 1]
    want = dequantize_rows(quantize_rows(x))
    assert ((rounded(x, 8, None) - want).abs() <= step).all()
    err8 = (want - x).pow(2).mean()
    assert (rounded(x, 16, None) - x).pow(2).mean() < err8 / 1e4  # 2^-16 of the step's square
    assert torch.equal(rounded(x, 8, "float16"), x.half().float())


def test_a_spec_rounds_only_its_layers_and_positions():
    k, v = torch.randn(2, 6, 1, 64).unbind(0)
    positions = torch.arange(6)
    apply = rounding("k:1,v:none,sink:2", num_layers=3)
    k0, v0 = apply(k, v, 0, positions)
    assert torch.equal(k0, k) and torch.equal(v0, v)
    k1, v1 = apply(k, v, 1, positions)
    assert torch.equal(k1[:2], k[:2]) and torch.equal(v1, v)
    assert torch.equal(k1[2:], dequantize_rows(quantize_rows(k[2:])))


def test_an_offset_rounds_the_keys_about_it():
    gen = torch.Generator().manual_seed(2)
    shared = torch.randn(2, 64, generator=gen) * 6  # [kv_heads, D]: what every key holds
    k = shared + torch.randn(50, 2, 64, generator=gen)
    v = torch.randn(50, 2, 64, generator=gen)
    mu, dev = k.mean(dim=0), k.std(dim=0)
    apply = rounding("kmu:calibration", 1, {"calibration": [(mu, dev)]})
    k1, v1 = apply(k, v, 0, torch.arange(50))
    assert torch.equal(k1, dequantize_rows(quantize_rows(k - mu)) + mu)
    assert torch.equal(v1, dequantize_rows(quantize_rows(v)))
    plain = dequantize_rows(quantize_rows(k))
    assert (k1 - k).pow(2).mean() < (plain - k).pow(2).mean() / 4
