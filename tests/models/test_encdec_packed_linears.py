"""The decoder's row linears on the C++ packed kernel (models/encdec/packed_linears.py): every
decoder linear but the cross K/V projections, and the LM head, are routed; each computes what
F.linear computes (float64 reference, float32 and bfloat16), and a row's bits do not depend
on the other rows of its call (1 row alone, 13 rows, 40 rows)."""

from __future__ import annotations

import pytest
import torch

from models.cpu_kernels import extension
from models.encdec.packed_linears import pack_decoder_linears
from models.loader import load_model
from tests.encdec_checkpoints import save_encdec_checkpoint

pytestmark = pytest.mark.cpu_kernels  # skipped off the CPU (tests/conftest.py)


@pytest.mark.parametrize("kind", ["t5v11", "bart"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@torch.inference_mode()
def test_packed_decoder_linears_equal_f_linear_and_ignore_the_batch(kind, dtype, tmp_path):
    ext = extension()
    assert ext is not None, "the C++ kernels did not build"
    model, _ = load_model(save_encdec_checkpoint(kind, tmp_path), dtype, torch.device("cpu"))
    routed = model.decoder_row_linears()
    names = {id(m): name for name, m in model.named_modules()}
    cross = ("EncDecAttention.k", "EncDecAttention.v", "encoder_attn.k", "encoder_attn.v")
    assert routed[-1] is model.lm_head
    assert all("decoder." in names[id(m)] for m in routed[:-1])
    assert not [m for m in routed if names[id(m)].endswith(cross)]
    decoder_linears = [m for n, m in model.named_modules() if "decoder." in n and m in routed]
    assert len(routed) == len(decoder_linears) + 1
    weights = {id(m): (m.weight.clone(), m.bias) for m in routed}
    assert pack_decoder_linears(model, ext) > 0
    gen = torch.Generator().manual_seed(0)
    for layer in routed:
        weight, bias = weights[id(layer)]
        x = torch.randn(40, weight.shape[1], generator=gen).to(weight.dtype)
        got = layer(x)
        want = torch.nn.functional.linear(x.double(), weight.double(), _double(bias))
        tol = 1e-4 if dtype == "float32" else 3e-2
        assert (got.double() - want).abs().max() <= tol * want.abs().max()
        for rows in (slice(0, 1), slice(7, 20), slice(0, 40)):
            assert torch.equal(layer(x[rows]), got[rows])


def _double(bias):
    return None if bias is None else bias.double()
